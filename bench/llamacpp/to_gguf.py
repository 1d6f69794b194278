#!/usr/bin/env python3
"""A Hugging Face Qwen3 checkpoint (safetensors, BF16) -> one GGUF file for llama.cpp.

Only for the side-by-side speed comparison in bench/llamacpp/run.sh: it writes what llama.cpp's
qwen3 loader reads (the architecture keys, the BPE vocabulary and merges, the tensors under
llama.cpp's names), matrices as BF16 unchanged, norm weights as F32 (as llama.cpp's own converter
stores 1-D tensors). Standard library only: no numpy, no gguf package.

    python3 bench/llamacpp/to_gguf.py models/tiny-qwen3 build/llamacpp/tiny-qwen3-bf16.gguf
"""
import json
import os
import struct
import sys
from array import array

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGN = 32
# GGUF value types and ggml tensor types used here.
T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY = 4, 5, 6, 7, 8, 9
GGML_F32, GGML_BF16 = 0, 30


def read_safetensors(model_dir):
    """name -> (dtype, shape, raw bytes) over every shard of the checkpoint."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for name in files:
        with open(os.path.join(model_dir, name), "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
            data = f.read()
        for key, info in header.items():
            if key == "__metadata__":
                continue
            a, b = info["data_offsets"]
            tensors[key] = (info["dtype"], info["shape"], data[a:b])
    return tensors


def bf16_to_f32_bytes(raw):
    halves = array("H")
    halves.frombytes(raw)
    return array("I", (h << 16 for h in halves)).tobytes()


class Writer:
    def __init__(self):
        self.kv = []  # encoded key/value pairs
        self.tensors = []  # (name, shape as ne0.., ggml type, bytes)

    @staticmethod
    def _str(s):
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def add(self, key, vtype, value):
        out = self._str(key) + struct.pack("<I", vtype)
        if vtype == T_STRING:
            out += self._str(value)
        elif vtype == T_UINT32:
            out += struct.pack("<I", value)
        elif vtype == T_INT32:
            out += struct.pack("<i", value)
        elif vtype == T_FLOAT32:
            out += struct.pack("<f", value)
        elif vtype == T_BOOL:
            out += struct.pack("<?", value)
        else:
            raise ValueError(vtype)
        self.kv.append(out)

    def add_array(self, key, etype, values):
        out = self._str(key) + struct.pack("<IIQ", T_ARRAY, etype, len(values))
        if etype == T_STRING:
            out += b"".join(self._str(v) for v in values)
        elif etype == T_INT32:
            out += struct.pack("<%di" % len(values), *values)
        else:
            raise ValueError(etype)
        self.kv.append(out)

    def tensor(self, name, hf_shape, ggml_type, data):
        # GGUF lists dimensions innermost first: a [rows, cols] row-major matrix is (cols, rows).
        self.tensors.append((name, list(reversed(hf_shape)), ggml_type, data))

    def write(self, path):
        infos, offset = [], 0
        for name, ne, ttype, data in self.tensors:
            infos.append(self._str(name) + struct.pack("<I", len(ne)) +
                         struct.pack("<%dQ" % len(ne), *ne) + struct.pack("<IQ", ttype, offset))
            offset += (len(data) + ALIGN - 1) // ALIGN * ALIGN
        with open(path, "wb") as f:
            f.write(GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(self.tensors), len(self.kv)))
            for kv in self.kv:
                f.write(kv)
            for info in infos:
                f.write(info)
            f.write(b"\0" * (-f.tell() % ALIGN))
            for _, _, _, data in self.tensors:
                f.write(data)
                f.write(b"\0" * (-len(data) % ALIGN))


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    model_dir, out = sys.argv[1], sys.argv[2]
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    tok = json.load(open(os.path.join(model_dir, "tokenizer.json")))
    if cfg.get("model_type") != "qwen3":
        sys.exit("to_gguf: only Qwen3 checkpoints (model_type qwen3)")

    w = Writer()
    arch = "qwen3"
    w.add("general.architecture", T_STRING, arch)
    w.add("general.name", T_STRING, os.path.basename(os.path.normpath(model_dir)))
    w.add("general.alignment", T_UINT32, ALIGN)
    w.add(arch + ".context_length", T_UINT32, cfg["max_position_embeddings"])
    w.add(arch + ".embedding_length", T_UINT32, cfg["hidden_size"])
    w.add(arch + ".block_count", T_UINT32, cfg["num_hidden_layers"])
    w.add(arch + ".feed_forward_length", T_UINT32, cfg["intermediate_size"])
    w.add(arch + ".attention.head_count", T_UINT32, cfg["num_attention_heads"])
    w.add(arch + ".attention.head_count_kv", T_UINT32, cfg["num_key_value_heads"])
    w.add(arch + ".attention.key_length", T_UINT32, cfg["head_dim"])
    w.add(arch + ".attention.value_length", T_UINT32, cfg["head_dim"])
    w.add(arch + ".attention.layer_norm_rms_epsilon", T_FLOAT32, cfg["rms_norm_eps"])
    rope = cfg.get("rope_parameters") or {}
    w.add(arch + ".rope.freq_base", T_FLOAT32, rope.get("rope_theta", cfg.get("rope_theta", 1e6)))

    # The byte-level BPE vocabulary: model tokens, then the added (special) ones.
    n_vocab = cfg["vocab_size"]
    tokens = [None] * n_vocab
    types = [1] * n_vocab  # 1 normal, 3 control
    for piece, i in tok["model"]["vocab"].items():
        tokens[i] = piece
    for t in tok["added_tokens"]:
        tokens[t["id"]] = t["content"]
        types[t["id"]] = 3 if t.get("special") else 4
    for i, t in enumerate(tokens):
        if t is None:
            tokens[i], types[i] = "[PAD%d]" % i, 5  # unused ids
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add("tokenizer.ggml.model", T_STRING, "gpt2")
    w.add("tokenizer.ggml.pre", T_STRING, "qwen2")
    w.add_array("tokenizer.ggml.tokens", T_STRING, tokens)
    w.add_array("tokenizer.ggml.token_type", T_INT32, types)
    w.add_array("tokenizer.ggml.merges", T_STRING, merges)
    w.add("tokenizer.ggml.eos_token_id", T_UINT32, cfg["eos_token_id"])
    w.add("tokenizer.ggml.bos_token_id", T_UINT32, cfg["bos_token_id"])
    w.add("tokenizer.ggml.add_bos_token", T_BOOL, False)

    hf = read_safetensors(model_dir)
    names = {
        "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }

    def put(gguf_name, hf_name):
        dtype, shape, raw = hf[hf_name]
        if dtype != "BF16":
            sys.exit("to_gguf: %s is %s, only BF16 checkpoints" % (hf_name, dtype))
        if len(shape) == 1:
            w.tensor(gguf_name, shape, GGML_F32, bf16_to_f32_bytes(raw))
        else:
            w.tensor(gguf_name, shape, GGML_BF16, raw)

    put("token_embd.weight", "model.embed_tokens.weight")
    for layer in range(cfg["num_hidden_layers"]):
        for hf_part, g in names.items():
            put("blk.%d.%s.weight" % (layer, g), "model.layers.%d.%s.weight" % (layer, hf_part))
    put("output_norm.weight", "model.norm.weight")
    if not cfg.get("tie_word_embeddings", False):
        put("output.weight", "lm_head.weight")
    w.write(out)
    print("wrote %s: %d tensors, %d tokens" % (out, len(w.tensors), n_vocab))


if __name__ == "__main__":
    main()
