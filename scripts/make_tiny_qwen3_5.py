#!/usr/bin/env python3
"""Writes models/tiny-qwen3-5 and models/tiny-qwen3-5-vl: random Qwen3.5 (hybrid Gated DeltaNet +
gated attention) checkpoints for tests (issue #25 item 3).

Python standard library only, deterministic (random.Random(seed)): running it again writes the
same bytes, so the committed files can be checked with `git diff --exit-code` after a rerun.

Shape (transformers' Qwen3_5TextConfig names): 4 layers, layer_types [linear, linear, linear,
full]; hidden 64, intermediate 128; full attention: 2 query heads / 1 KV head of head_dim 256,
partial_rotary_factor 0.25 (64 rotated dims), q_proj yields query and output gate per head;
Gated DeltaNet: linear_num_key_heads 2, linear_num_value_heads 4, key head dim 32, value head dim
16, conv kernel 4. vocab_size 8192 with tied embeddings: tiny-qwen3's tokenizer (linked from
../tiny-qwen3) encodes for it.

Two layouts of the same weights:
  tiny-qwen3-5      Qwen3_5ForCausalLM (model_type qwen3_5_text), text weights under `model.`
  tiny-qwen3-5-vl   Qwen3_5ForConditionalGeneration (model_type qwen3_5, nested text_config and a
                    tiny vision_config), text weights under `model.language_model.`, plus a few
                    `model.visual.*` tensors (random; a loader of the text model skips them)

Scales: embeddings 0.5, projections 1/sqrt(fan_in); zero-centred RMSNorm weights (the models'
Qwen3_5RMSNorm computes x·(1 + w)) 0.1·N(0, 1); the gated norm's weight (plain w)
1 + 0.1·N(0, 1);
conv weights 0.5·N(0, 1); A_log = log(U(0.05, 2)) and dt_bias N(0, 0.5) so that the decay
exp(g) spans forgetting fast and remembering across the 64-token chunks. Weights BF16.

  python3 scripts/make_tiny_qwen3_5.py [--out models/tiny-qwen3-5] [--seed 35]
"""
import argparse
import copy
import json
import math
import os
import random

from make_tiny_moe import write_safetensors  # the same BF16 safetensors writer

VOCAB, HIDDEN, INTER, LAYERS = 8192, 64, 128, 4
HEADS_Q, HEADS_KV, HEAD_DIM, ROTARY_FACTOR = 2, 1, 256, 0.25
LIN_HEADS_K, LIN_HEADS_V, LIN_DK, LIN_DV, CONV_K = 2, 4, 32, 16, 4
LAYER_TYPES = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]


def text_config():
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "bos_token_id": 8189,
        "eos_token_id": 8189,
        "dtype": "bfloat16",
        "full_attention_interval": 4,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": INTER,
        "layer_types": LAYER_TYPES,
        "linear_conv_kernel_dim": CONV_K,
        "linear_key_head_dim": LIN_DK,
        "linear_num_key_heads": LIN_HEADS_K,
        "linear_num_value_heads": LIN_HEADS_V,
        "linear_value_head_dim": LIN_DV,
        "max_position_embeddings": 4096,
        "num_attention_heads": HEADS_Q,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": HEADS_KV,
        "partial_rotary_factor": ROTARY_FACTOR,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": [11, 11, 10],
            "partial_rotary_factor": ROTARY_FACTOR,
            "rope_theta": 10000000,
            "rope_type": "default",
        },
        "tie_word_embeddings": True,
        "use_cache": True,
        "vocab_size": VOCAB,
    }


def vl_config():
    text = copy.deepcopy(text_config())
    del text["architectures"]
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "image_token_id": 8180,
        "video_token_id": 8181,
        "vision_start_token_id": 8182,
        "vision_end_token_id": 8183,
        "language_model_only": False,
        "tie_word_embeddings": True,
        "text_config": text,
        "vision_config": {
            "deepstack_visual_indexes": [],
            "depth": 1,
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_size": 32,
            "in_channels": 3,
            "initializer_range": 0.02,
            "intermediate_size": 32,
            "model_type": "qwen3_5",
            "num_heads": 2,
            "num_position_embeddings": 16,
            "out_hidden_size": HIDDEN,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
    }


def tensors(rng):
    """(name under model., shape, values) of the text model, in a fixed order."""
    out = []

    def add(name, shape, gen):
        out.append((name, shape, [gen() for _ in range(math.prod(shape))]))

    def normal(name, shape, std, mean=0.0):
        add(name, shape, lambda: mean + std * rng.gauss(0.0, 1.0))

    q_dim, kv_dim = HEADS_Q * HEAD_DIM, HEADS_KV * HEAD_DIM
    key_dim, value_dim = LIN_HEADS_K * LIN_DK, LIN_HEADS_V * LIN_DV
    conv_dim = 2 * key_dim + value_dim
    normal("embed_tokens.weight", [VOCAB, HIDDEN], 0.5)
    for l, kind in enumerate(LAYER_TYPES):
        p = f"layers.{l}."
        normal(p + "input_layernorm.weight", [HIDDEN], 0.1)
        if kind == "full_attention":
            a = p + "self_attn."
            # q_proj rows: per query head, head_dim query rows then head_dim gate rows.
            normal(a + "q_proj.weight", [2 * q_dim, HIDDEN], HIDDEN ** -0.5)
            normal(a + "k_proj.weight", [kv_dim, HIDDEN], HIDDEN ** -0.5)
            normal(a + "v_proj.weight", [kv_dim, HIDDEN], HIDDEN ** -0.5)
            normal(a + "q_norm.weight", [HEAD_DIM], 0.1)
            normal(a + "k_norm.weight", [HEAD_DIM], 0.1)
            normal(a + "o_proj.weight", [HIDDEN, q_dim], q_dim ** -0.5)
        else:
            a = p + "linear_attn."
            normal(a + "in_proj_qkv.weight", [conv_dim, HIDDEN], HIDDEN ** -0.5)
            normal(a + "in_proj_z.weight", [value_dim, HIDDEN], HIDDEN ** -0.5)
            normal(a + "in_proj_b.weight", [LIN_HEADS_V, HIDDEN], HIDDEN ** -0.5)
            normal(a + "in_proj_a.weight", [LIN_HEADS_V, HIDDEN], HIDDEN ** -0.5)
            normal(a + "conv1d.weight", [conv_dim, 1, CONV_K], 0.5)
            add(a + "A_log", [LIN_HEADS_V], lambda: math.log(rng.uniform(0.05, 2.0)))
            normal(a + "dt_bias", [LIN_HEADS_V], 0.5)
            normal(a + "norm.weight", [LIN_DV], 0.1, 1.0)
            normal(a + "out_proj.weight", [HIDDEN, value_dim], value_dim ** -0.5)
        normal(p + "post_attention_layernorm.weight", [HIDDEN], 0.1)
        normal(p + "mlp.gate_proj.weight", [INTER, HIDDEN], HIDDEN ** -0.5)
        normal(p + "mlp.up_proj.weight", [INTER, HIDDEN], HIDDEN ** -0.5)
        normal(p + "mlp.down_proj.weight", [HIDDEN, INTER], INTER ** -0.5)
    normal("norm.weight", [HIDDEN], 0.1)
    return out


def vision_tensors(rng):
    """A few tensors of the vision tower, named as the wrapper saves them; never read by oscar."""
    out = []
    for name, shape in (("model.visual.patch_embed.proj.weight", [32, 3, 2, 16, 16]),
                        ("model.visual.patch_embed.proj.bias", [32]),
                        ("model.visual.pos_embed.weight", [16, 32])):
        out.append((name, shape, [0.02 * rng.gauss(0.0, 1.0) for _ in range(math.prod(shape))]))
    return out


def write_dir(out, config, items):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(out, "model.safetensors"), items,
                      created_by="scripts/make_tiny_qwen3_5.py")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        link = os.path.join(out, name)
        if not os.path.lexists(link):
            os.symlink(os.path.join("..", "tiny-qwen3", name), link)
    print(f"wrote {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="models/tiny-qwen3-5")
    ap.add_argument("--seed", type=int, default=35)
    args = ap.parse_args()
    text = tensors(random.Random(args.seed))
    write_dir(args.out, text_config(), [("model." + n, s, v) for n, s, v in text])
    vl = [("model.language_model." + n, s, v) for n, s, v in text]
    vl += vision_tensors(random.Random(args.seed + 1))
    write_dir(args.out.rstrip("/") + "-vl", vl_config(), vl)


if __name__ == "__main__":
    main()
