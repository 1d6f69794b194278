#!/usr/bin/env python3
"""A Qwen3 dense checkpoint of a real shape with random BF16 weights, for CPU decode at real scale
beside llama.cpp (issue #28): both engines read the same file (oscar the safetensors directory,
llama.cpp its to_gguf.py conversion), so they compute with the same weights. Speed only: the
weights are noise, the text is meaningless.

  python3 bench/llamacpp/random_checkpoint.py CONFIG_JSON TOKENIZER_DIR OUT_DIR [--seed N]

CONFIG_JSON: a Qwen3ForCausalLM config.json (e.g. ../shared/configs/qwen3-0.6b.json);
TOKENIZER_DIR: its tokenizer.json (and tokenizer_config.json, where present) are copied (the real
Qwen3 tokenizer: build/data/qwen3_tokenizer, which configure unpacks). Writes OUT_DIR/{config.json, tokenizer*.json,
model.safetensors} and data/dev_eval.txt (the embedded model's text, whence bench_model draws
its prompts).
Matrices: |w| in [2^-7, 2^-6) with random signs and mantissas (activations stay finite through
the layers); norm weights 1. Standard library only (random bytes masked into BF16 patterns).
"""
import json
import os
import random
import shutil
import struct
import sys

# BF16 bits of a matrix value: sign | exponent 120 (2^-7) | mantissa. Little-endian: the low byte
# holds the exponent's last bit (0) and the mantissa, the high byte the sign and exponent >> 1.
HIGH = bytes((b & 0x80) | 60 for b in range(256))
LOW = bytes(b & 0x7F for b in range(256))
ONE = struct.pack("<H", 0x3F80)  # 1.0


def random_matrix(rng, n):
    # In pieces: randbytes draws 8·size bits as one C int count.
    data = bytearray().join(rng.randbytes(min(1 << 24, 2 * n - i)) for i in range(0, 2 * n, 1 << 24))
    data[0::2] = data[0::2].translate(LOW)
    data[1::2] = data[1::2].translate(HIGH)
    return bytes(data)


def tensors(cfg):
    """(name, shape, kind) of every tensor of a Qwen3 dense checkpoint, in file order."""
    h, inter, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", [cfg["vocab_size"], h], "m")]
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        out += [(p + "input_layernorm.weight", [h], "1"),
                (p + "self_attn.q_proj.weight", [q, h], "m"),
                (p + "self_attn.k_proj.weight", [kv, h], "m"),
                (p + "self_attn.v_proj.weight", [kv, h], "m"),
                (p + "self_attn.o_proj.weight", [h, q], "m"),
                (p + "self_attn.q_norm.weight", [hd], "1"),
                (p + "self_attn.k_norm.weight", [hd], "1"),
                (p + "post_attention_layernorm.weight", [h], "1"),
                (p + "mlp.gate_proj.weight", [inter, h], "m"),
                (p + "mlp.up_proj.weight", [inter, h], "m"),
                (p + "mlp.down_proj.weight", [h, inter], "m")]
    out.append(("model.norm.weight", [h], "1"))
    if not cfg.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", [cfg["vocab_size"], h], "m"))
    return out


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--seed")]
    if len(args) != 3 or "-h" in args or "--help" in args:
        print(__doc__)
        return 2
    seed = int(next((a.split("=")[1] for a in sys.argv[1:] if a.startswith("--seed=")), "1"))
    config_path, tok_dir, out_dir = args
    cfg = json.load(open(config_path))
    if cfg.get("architectures", ["Qwen3ForCausalLM"])[0] != "Qwen3ForCausalLM":
        print("random_checkpoint.py: a Qwen3ForCausalLM config only", file=sys.stderr)
        return 1
    os.makedirs(out_dir, exist_ok=True)
    json.dump(cfg, open(os.path.join(out_dir, "config.json"), "w"), indent=1)
    for f in ("tokenizer.json", "tokenizer_config.json"):  # the second where the folder has it
        if os.path.exists(os.path.join(tok_dir, f)):
            shutil.copy(os.path.join(tok_dir, f), out_dir)
    # bench_model draws its prompts from the model's data/dev_eval.txt: the embedded model's.
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    os.makedirs(os.path.join(out_dir, "data"), exist_ok=True)
    shutil.copy(os.path.join(root, "models", "tiny-qwen3", "data", "dev_eval.txt"),
                os.path.join(out_dir, "data"))
    rng = random.Random(seed)
    table = tensors(cfg)
    header, offset = {}, 0
    for name, shape, _ in table:
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(os.path.join(out_dir, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for i, (name, shape, kind) in enumerate(table):
            n = 1
            for d in shape:
                n *= d
            f.write(random_matrix(rng, n) if kind == "m" else ONE * n)
            if (i + 1) % 50 == 0 or i + 1 == len(table):
                print("%d / %d tensors" % (i + 1, len(table)), file=sys.stderr)
    print("\n%s: %.2f GB of weights" % (out_dir, offset / 1e9), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
