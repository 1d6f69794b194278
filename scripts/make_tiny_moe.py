#!/usr/bin/env python3
"""Writes models/tiny-qwen3-moe: a random Qwen3-MoE checkpoint for tests (issue #25).

Python standard library only, deterministic (random.Random(seed)): running it again writes the
same bytes, so the committed files can be checked with `git diff --exit-code` after a rerun.

Shape: 3 layers, hidden 64, 2 query heads / 1 KV head of 128, 8 experts of width 32, top-2 with
renormalised weights; layer 1 is dense (mlp_only_layers, intermediate 128), layers 0 and 2 sparse.
vocab_size 8192 with tied embeddings: tiny-qwen3's tokenizer (linked from ../tiny-qwen3) encodes
for it. Weights BF16, named as Hugging Face saves a Qwen3-MoE checkpoint
(`model.layers.{l}.mlp.gate.weight`, `model.layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.weight`).
Scales: embeddings 0.5 (logits of a few units), projections 1/sqrt(fan_in), the router 0.25 (router
logits of about 2: clear top-2 margins), norms 1 + 0.1·N(0, 1).

  python3 scripts/make_tiny_moe.py [--out models/tiny-qwen3-moe] [--seed 25]
"""
import argparse
import json
import math
import os
import random
import struct

VOCAB, HIDDEN, LAYERS, HEADS_Q, HEADS_KV, HEAD_DIM = 8192, 64, 3, 2, 1, 128
EXPERTS, TOP_K, MOE_INTER, DENSE_INTER, DENSE_LAYERS = 8, 2, 32, 128, [1]


def config():
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 8189,
        "eos_token_id": 8189,
        "decoder_sparse_step": 1,
        "dtype": "bfloat16",
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": DENSE_INTER,
        "max_position_embeddings": 4096,
        "max_window_layers": LAYERS,
        "mlp_only_layers": DENSE_LAYERS,
        "moe_intermediate_size": MOE_INTER,
        "norm_topk_prob": True,
        "num_attention_heads": HEADS_Q,
        "num_experts": EXPERTS,
        "num_experts_per_tok": TOP_K,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": HEADS_KV,
        "output_router_logits": False,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
        "router_aux_loss_coef": 0.001,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB,
    }


def bf16_bytes(values):
    """float values -> little-endian BF16 bytes, rounded to nearest even."""
    out = bytearray(2 * len(values))
    for i, v in enumerate(values):
        (u,) = struct.unpack("<I", struct.pack("<f", v))
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        struct.pack_into("<H", out, 2 * i, u & 0xFFFF)
    return bytes(out)


def tensors(rng):
    """(name, shape, values) in a fixed order."""
    out = []

    def normal(name, shape, std, mean=0.0):
        n = math.prod(shape)
        out.append((name, shape, [mean + std * rng.gauss(0.0, 1.0) for _ in range(n)]))

    q_dim, kv_dim = HEADS_Q * HEAD_DIM, HEADS_KV * HEAD_DIM
    normal("model.embed_tokens.weight", [VOCAB, HIDDEN], 0.5)
    for l in range(LAYERS):
        p = f"model.layers.{l}."
        normal(p + "input_layernorm.weight", [HIDDEN], 0.1, 1.0)
        normal(p + "self_attn.q_proj.weight", [q_dim, HIDDEN], HIDDEN ** -0.5)
        normal(p + "self_attn.k_proj.weight", [kv_dim, HIDDEN], HIDDEN ** -0.5)
        normal(p + "self_attn.v_proj.weight", [kv_dim, HIDDEN], HIDDEN ** -0.5)
        normal(p + "self_attn.q_norm.weight", [HEAD_DIM], 0.1, 1.0)
        normal(p + "self_attn.k_norm.weight", [HEAD_DIM], 0.1, 1.0)
        normal(p + "self_attn.o_proj.weight", [HIDDEN, q_dim], q_dim ** -0.5)
        normal(p + "post_attention_layernorm.weight", [HIDDEN], 0.1, 1.0)
        if l in DENSE_LAYERS:
            normal(p + "mlp.gate_proj.weight", [DENSE_INTER, HIDDEN], HIDDEN ** -0.5)
            normal(p + "mlp.up_proj.weight", [DENSE_INTER, HIDDEN], HIDDEN ** -0.5)
            normal(p + "mlp.down_proj.weight", [HIDDEN, DENSE_INTER], DENSE_INTER ** -0.5)
            continue
        normal(p + "mlp.gate.weight", [EXPERTS, HIDDEN], 0.25)
        for e in range(EXPERTS):
            x = f"{p}mlp.experts.{e}."
            normal(x + "gate_proj.weight", [MOE_INTER, HIDDEN], HIDDEN ** -0.5)
            normal(x + "up_proj.weight", [MOE_INTER, HIDDEN], HIDDEN ** -0.5)
            normal(x + "down_proj.weight", [HIDDEN, MOE_INTER], MOE_INTER ** -0.5)
    normal("model.norm.weight", [HIDDEN], 0.1, 1.0)
    return out


def write_safetensors(path, items, created_by="scripts/make_tiny_moe.py"):
    """items: (name, shape, float values), written as BF16 in that order."""
    header, blobs, offset = {}, [], 0
    for name, shape, values in items:
        data = bf16_bytes(values)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt", "created_by": created_by}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="models/tiny-qwen3-moe")
    ap.add_argument("--seed", type=int, default=25)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config(), f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(args.out, "model.safetensors"), tensors(random.Random(args.seed)))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        link = os.path.join(args.out, name)
        if not os.path.lexists(link):
            os.symlink(os.path.join("..", "tiny-qwen3", name), link)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
