#!/usr/bin/env python3
"""Writes models/tiny-qwen3-next: a random Qwen3-Next (hybrid Gated DeltaNet + gated attention,
sparse MoE FFN with a shared expert) checkpoint for tests (issue #25).

Python standard library only, deterministic (random.Random(seed)): running it again writes the
same bytes, so the committed files can be checked with `git diff --exit-code` after a rerun.

Shape (transformers' Qwen3NextConfig names): 4 layers, full_attention_interval 4 (layers
[linear, linear, linear, full], no layer_types key, as the real 80B-A3B config); hidden 64; full
attention: 2 query heads / 1 KV head of head_dim 256 (the real model's), partial_rotary_factor
0.25 (64 rotated dims), q_proj yields query and output gate per head; Gated DeltaNet:
linear_num_key_heads 2, linear_num_value_heads 4 (2 value heads per key head, so the per-group
interleave of in_proj_qkvz / in_proj_ba matters), key head dim 32, value head dim 16, conv
kernel 4. Every layer sparse: 8 experts of width 32, top-2, norm_topk_prob, plus a shared expert
of width 48 (unlike the routed width, so that a mix-up of the two shows) with its sigmoid gate.
vocab_size 8192, lm_head untied (as the real model): tiny-qwen3's tokenizer (linked from
../tiny-qwen3) encodes for it. Top-level rope_theta / partial_rotary_factor and torch_dtype as
the real config spells them.

Tensor names are those of the Hugging Face checkpoints of Qwen3-Next-80B-A3B:
  model.layers.{l}.linear_attn.in_proj_qkvz.weight [2·key_dim + 2·value_dim, hidden] and
  linear_attn.in_proj_ba.weight [2·heads_v, hidden], interleaved per key-head group (random here,
  so the layout only matters to the reader: model/weights.h); conv1d, A_log, dt_bias, norm,
  out_proj as Qwen3.5's;
  model.layers.{l}.mlp.gate.weight (router), mlp.experts.{e}.{gate,up,down}_proj.weight (one
  tensor per expert; transformers 5 fuses them into mlp.experts.gate_up_proj at load, its
  conversion mapping for qwen3_next), mlp.shared_expert.{gate,up,down}_proj.weight,
  mlp.shared_expert_gate.weight [1, hidden].

Scales: embeddings 0.5, projections 1/sqrt(fan_in), the router 0.25 (clear top-2 margins),
zero-centred RMSNorm weights (x·(1 + w)) 0.1·N(0, 1), the gated norm's weight 1 + 0.1·N(0, 1),
conv weights 0.5·N(0, 1), A_log = log(U(0.05, 2)), dt_bias N(0, 0.5). Weights BF16.

  python3 scripts/make_tiny_qwen3_next.py [--out models/tiny-qwen3-next] [--seed 80]
"""
import argparse
import json
import math
import os
import random

from make_tiny_moe import write_safetensors  # the same BF16 safetensors writer

VOCAB, HIDDEN, INTER, LAYERS, INTERVAL = 8192, 64, 128, 4, 4
HEADS_Q, HEADS_KV, HEAD_DIM, ROTARY_FACTOR = 2, 1, 256, 0.25
LIN_HEADS_K, LIN_HEADS_V, LIN_DK, LIN_DV, CONV_K = 2, 4, 32, 16, 4
EXPERTS, TOP_K, MOE_INTER, SHARED_INTER = 8, 2, 32, 48


def config():
    return {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 8189,
        "eos_token_id": 8189,
        "decoder_sparse_step": 1,
        "full_attention_interval": INTERVAL,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": INTER,
        "linear_conv_kernel_dim": CONV_K,
        "linear_key_head_dim": LIN_DK,
        "linear_num_key_heads": LIN_HEADS_K,
        "linear_num_value_heads": LIN_HEADS_V,
        "linear_value_head_dim": LIN_DV,
        "max_position_embeddings": 4096,
        "mlp_only_layers": [],
        "moe_intermediate_size": MOE_INTER,
        "norm_topk_prob": True,
        "num_attention_heads": HEADS_Q,
        "num_experts": EXPERTS,
        "num_experts_per_tok": TOP_K,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": HEADS_KV,
        "output_router_logits": False,
        "partial_rotary_factor": ROTARY_FACTOR,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 10000000,
        "router_aux_loss_coef": 0.001,
        "shared_expert_intermediate_size": SHARED_INTER,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB,
    }


def linear_layer(l):
    return (l + 1) % INTERVAL != 0


def tensors(rng):
    """(name, shape, values) in a fixed order."""
    out = []

    def add(name, shape, gen):
        out.append((name, shape, [gen() for _ in range(math.prod(shape))]))

    def normal(name, shape, std, mean=0.0):
        add(name, shape, lambda: mean + std * rng.gauss(0.0, 1.0))

    q_dim, kv_dim = HEADS_Q * HEAD_DIM, HEADS_KV * HEAD_DIM
    key_dim, value_dim = LIN_HEADS_K * LIN_DK, LIN_HEADS_V * LIN_DV
    conv_dim = 2 * key_dim + value_dim
    normal("model.embed_tokens.weight", [VOCAB, HIDDEN], 0.5)
    for l in range(LAYERS):
        p = f"model.layers.{l}."
        normal(p + "input_layernorm.weight", [HIDDEN], 0.1)
        if linear_layer(l):
            a = p + "linear_attn."
            # Rows interleaved per key-head group: q, k, the group's v heads, its z heads.
            normal(a + "in_proj_qkvz.weight", [2 * key_dim + 2 * value_dim, HIDDEN],
                   HIDDEN ** -0.5)
            # Per key-head group: the group's b heads, then its a heads.
            normal(a + "in_proj_ba.weight", [2 * LIN_HEADS_V, HIDDEN], HIDDEN ** -0.5)
            normal(a + "conv1d.weight", [conv_dim, 1, CONV_K], 0.5)
            add(a + "A_log", [LIN_HEADS_V], lambda: math.log(rng.uniform(0.05, 2.0)))
            normal(a + "dt_bias", [LIN_HEADS_V], 0.5)
            normal(a + "norm.weight", [LIN_DV], 0.1, 1.0)
            normal(a + "out_proj.weight", [HIDDEN, value_dim], value_dim ** -0.5)
        else:
            a = p + "self_attn."
            # q_proj rows: per query head, head_dim query rows then head_dim gate rows.
            normal(a + "q_proj.weight", [2 * q_dim, HIDDEN], HIDDEN ** -0.5)
            normal(a + "k_proj.weight", [kv_dim, HIDDEN], HIDDEN ** -0.5)
            normal(a + "v_proj.weight", [kv_dim, HIDDEN], HIDDEN ** -0.5)
            normal(a + "q_norm.weight", [HEAD_DIM], 0.1)
            normal(a + "k_norm.weight", [HEAD_DIM], 0.1)
            normal(a + "o_proj.weight", [HIDDEN, q_dim], q_dim ** -0.5)
        normal(p + "post_attention_layernorm.weight", [HIDDEN], 0.1)
        normal(p + "mlp.gate.weight", [EXPERTS, HIDDEN], 0.25)
        for e in range(EXPERTS):
            x = f"{p}mlp.experts.{e}."
            normal(x + "gate_proj.weight", [MOE_INTER, HIDDEN], HIDDEN ** -0.5)
            normal(x + "up_proj.weight", [MOE_INTER, HIDDEN], HIDDEN ** -0.5)
            normal(x + "down_proj.weight", [HIDDEN, MOE_INTER], MOE_INTER ** -0.5)
        s = p + "mlp.shared_expert."
        normal(s + "gate_proj.weight", [SHARED_INTER, HIDDEN], HIDDEN ** -0.5)
        normal(s + "up_proj.weight", [SHARED_INTER, HIDDEN], HIDDEN ** -0.5)
        normal(s + "down_proj.weight", [HIDDEN, SHARED_INTER], SHARED_INTER ** -0.5)
        normal(p + "mlp.shared_expert_gate.weight", [1, HIDDEN], HIDDEN ** -0.5)
    normal("model.norm.weight", [HIDDEN], 0.1)
    normal("lm_head.weight", [VOCAB, HIDDEN], HIDDEN ** -0.5)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="models/tiny-qwen3-next")
    ap.add_argument("--seed", type=int, default=80)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config(), f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(args.out, "model.safetensors"),
                      tensors(random.Random(args.seed)),
                      created_by="scripts/make_tiny_qwen3_next.py")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        link = os.path.join(args.out, name)
        if not os.path.lexists(link):
            os.symlink(os.path.join("..", "tiny-qwen3", name), link)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
