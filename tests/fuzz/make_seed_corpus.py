#!/usr/bin/env python3
"""Writes the small seed corpora of the format fuzzers (tests/fuzz/corpus/fuzz_safetensors/ and
fuzz_model_config/). Re-run after changing it; the outputs are committed (a few KB in all)."""
import json
import os
import struct

ROOT = os.path.dirname(os.path.abspath(__file__))


def safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, bytes). Contiguous data, header padded to 8."""
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors)


def main():
    out = os.path.join(ROOT, "corpus", "fuzz_safetensors")
    os.makedirs(out, exist_ok=True)
    f32 = struct.pack("<4f", 1.0, -2.5, 0.0, 3.0)
    seeds = {
        "empty.safetensors": safetensors([]),
        "one_f32.safetensors": safetensors([("w", "F32", [2, 2], f32)]),
        "metadata.safetensors": safetensors([("a", "BF16", [3], struct.pack("<3H", 0x3F80, 0xC000, 0))],
                                            {"format": "oscar-rotations", "version": "1"}),
        "all_dtypes.safetensors": safetensors([
            ("bf16", "BF16", [2], struct.pack("<2H", 0x3F80, 0x4000)),
            ("f16", "F16", [1, 2], struct.pack("<2H", 0x3C00, 0xC000)),
            ("f32", "F32", [4], f32),
            ("i32", "I32", [2], struct.pack("<2i", -5, 7)),
            ("i64", "I64", [2], struct.pack("<2q", 8189, -1)),
            ("empty", "F32", [0, 3], b""),
            ("scalar", "F32", [], struct.pack("<f", 0.5)),
        ]),
        "layers.safetensors": safetensors([
            ("model.layers.0.self_attn.q_norm.weight", "BF16", [4], struct.pack("<4H", *[0x3F80] * 4)),
            ("model.layers.0.self_attn.k_norm.weight", "BF16", [4], struct.pack("<4H", *[0x3F80] * 4)),
        ]),
    }
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)

    out = os.path.join(ROOT, "corpus", "fuzz_model_config")
    os.makedirs(out, exist_ok=True)
    base = {
        "architectures": ["Qwen3ForCausalLM"], "vocab_size": 1000, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000, "rope_scaling": None,
        "tie_word_embeddings": True, "eos_token_id": [2, 3], "bos_token_id": 1,
    }
    v5 = dict(base)
    del v5["rope_theta"]
    v5["rope_parameters"] = {"rope_theta": 1e6, "rope_type": "default"}
    qwen2 = dict(base, architectures=["Qwen2ForCausalLM"])
    yarn = dict(base, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    for name, cfg in {"qwen3.json": base, "qwen3_v5.json": v5, "qwen2.json": qwen2,
                      "yarn.json": yarn}.items():
        with open(os.path.join(out, name), "w") as f:
            json.dump(cfg, f, indent=1)


if __name__ == "__main__":
    main()
