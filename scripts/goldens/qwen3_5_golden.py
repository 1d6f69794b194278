#!/usr/bin/env python3
"""Hugging Face golden logits for models/tiny-qwen3-5 (issue #25 item 3).

Runs the tiny Qwen3.5 hybrid checkpoint (scripts/make_tiny_qwen3_5.py) through transformers'
Qwen3_5ForCausalLM on the CPU in float32 (eager attention; on the CPU transformers uses its torch
fallbacks: torch_causal_conv1d / causal_conv1d_fn, torch_chunk_gated_delta_rule for a prompt,
torch_recurrent_gated_delta_rule for cached one-token steps), and writes one file,
tests/data/golden/qwen3_5_golden.safetensors (read by tests/model/test_qwen3_5_model.cpp):

  {name}.input_ids     int64 [T]
  {name}.logits_cols   float32 [T, 512]  logits of every position at vocab ids 0, 16, 32, ...
  {name}.logits_last4  float32 [min(4, T), vocab]  full logits of the last positions
  {name}.argmax        int64 [T]  top-1 id of every position (over the full vocab)
  {name}.margin        float32 [T] top-1 minus top-2 logit of every position
  {name}.greedy_ids    int64 [32] greedy continuation, each step a full forward (no cache)
  __metadata__         versions, the output gate's activation as read from the reference code,
                       whether the cached (recurrent decode) greedy run agrees, and the
                       largest |logit| difference of the Qwen3_5ForConditionalGeneration layout
                       (models/tiny-qwen3-5-vl) from the causal LM on each prompt

Prompts: tiny-qwen3's golden prompt p1_class (32 real token ids) and seeded random sequences of
100 ids (two chunks of 64 in the chunked delta rule, the second partial) and 200 ids.

Needs torch, transformers >= 5.x with qwen3_5 (5.17 was the reference) and safetensors. From the
repository root:

  python3 scripts/goldens/qwen3_5_golden.py
"""
import argparse
import inspect
import json
import os
import random
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration
from transformers.models.qwen3_5 import modeling_qwen3_5 as m

GREEDY_STEPS = 32
COL_STRIDE = 16
LAST_ROWS = 4


def prompts(repo):
    with open(os.path.join(repo, "models/tiny-qwen3/golden/golden_index.json")) as f:
        index = json.load(f)
    out = [(p["name"], list(p["input_ids"])) for p in index["prompts"] if p["name"] == "p1_class"]
    rng = random.Random(35)
    out.append(("r100", [rng.randrange(8192) for _ in range(100)]))
    out.append(("r200", [rng.randrange(8192) for _ in range(200)]))
    return out


def gate_activation():
    """What Qwen3_5Attention.forward applies to the output gate, read from its source."""
    src = inspect.getsource(m.Qwen3_5Attention.forward)
    if "torch.sigmoid(gate)" in src:
        return "sigmoid"
    sys.exit("Qwen3_5Attention.forward: no 'torch.sigmoid(gate)'; check the output gate by hand:\n"
             + src)


def load_vl(path):
    """The ConditionalGeneration layout; its random vision tower may not match the tiny
    vision_config's shapes exactly, so fall back to loading the text weights by hand."""
    try:
        model, info = Qwen3_5ForConditionalGeneration.from_pretrained(
            path, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
        bad = [k for k in info.get("missing_keys", []) if not k.startswith("model.visual.")]
        bad += list(info.get("unexpected_keys", []))
        bad += [k for k in info.get("mismatched_keys", []) if "visual" not in str(k)]
        if bad:
            sys.exit(f"{path}: text weights do not load cleanly: {bad}")
        return model, "from_pretrained"
    except (RuntimeError, ValueError) as e:
        print(f"{path}: from_pretrained failed ({str(e)[:200]}); loading text weights by hand")
    config = transformers.AutoConfig.from_pretrained(path)
    model = Qwen3_5ForConditionalGeneration(config).to(torch.float32)
    sd = {k: v.float() for k, v in load_file(os.path.join(path, "model.safetensors")).items()
          if not k.startswith("model.visual.")}
    res = model.load_state_dict(sd, strict=False)
    bad = [k for k in res.missing_keys
           if not k.startswith("model.visual.") and k != "lm_head.weight"]
    if bad or res.unexpected_keys:
        sys.exit(f"{path}: missing {bad}, unexpected {res.unexpected_keys}")
    model.tie_weights()
    return model, "load_state_dict (text weights)"


def cached_greedy(model, x):
    """Greedy steps through transformers' own cache: the prompt once (chunked delta rule), then one
    token a step (causal_conv1d_update and the recurrent delta rule on the cached states)."""
    out = model(x, use_cache=True)
    past, last, ids = out.past_key_values, out.logits[0, -1], []
    for _ in range(GREEDY_STEPS):
        ids.append(int(torch.argmax(last)))
        out = model(torch.tensor([[ids[-1]]]), past_key_values=past, use_cache=True)
        past, last = out.past_key_values, out.logits[0, -1]
    return ids


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/tiny-qwen3-5")
    ap.add_argument("--out", default="tests/data/golden/qwen3_5_golden.safetensors")
    args = ap.parse_args()
    if int(transformers.__version__.split(".")[0]) < 5:
        sys.exit(f"transformers {transformers.__version__}: need 5.x")
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))

    act = gate_activation()
    print(f"output gate activation in Qwen3_5Attention.forward: {act} "
          f"(config output_gate_type, if any, is not read by transformers)")
    model, info = Qwen3_5ForCausalLM.from_pretrained(
        args.model, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f"checkpoint does not load cleanly: {problems}")
    model = model.eval()
    cfg = model.config
    print(f"layer_types {cfg.layer_types}, head_dim {cfg.head_dim}, "
          f"partial_rotary_factor {cfg.rope_parameters.get('partial_rotary_factor')}")
    vl, vl_how = load_vl(args.model.rstrip("/") + "-vl")
    vl = vl.eval()

    tensors, meta = {}, {
        "compute": "transformers Qwen3_5ForCausalLM, bf16 weights loaded with dtype=float32, "
                   "attn_implementation=eager, CPU float32 (torch fallbacks of the DeltaNet ops)",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "output_gate_activation": act,
        "vl_load": vl_how,
    }
    cols = torch.arange(0, cfg.vocab_size, COL_STRIDE)
    with torch.no_grad():
        for name, ids in prompts(os.getcwd()):
            x = torch.tensor([ids])
            logits = model(x, use_cache=False).logits[0].float()
            vl_logits = vl(input_ids=x, use_cache=False).logits[0].float()
            vl_diff = float((vl_logits - logits).abs().max())
            top2 = torch.topk(logits, 2, dim=-1)
            rows = min(LAST_ROWS, len(ids))
            tensors[f"{name}.input_ids"] = torch.tensor(ids, dtype=torch.int64)
            tensors[f"{name}.logits_cols"] = logits[:, cols].contiguous()
            tensors[f"{name}.logits_last4"] = logits[-rows:].contiguous()
            tensors[f"{name}.argmax"] = top2.indices[:, 0].contiguous()
            tensors[f"{name}.margin"] = (top2.values[:, 0] - top2.values[:, 1]).contiguous()
            seq, greedy, margin = list(ids), [], float("inf")
            last = logits[-1]
            for _ in range(GREEDY_STEPS):
                v, i = torch.topk(last, 2)
                margin = min(margin, float(v[0] - v[1]))
                greedy.append(int(i[0]))
                seq.append(int(i[0]))
                last = model(torch.tensor([seq]), use_cache=False).logits[0, -1].float()
            cached = cached_greedy(model, x)
            tensors[f"{name}.greedy_ids"] = torch.tensor(greedy, dtype=torch.int64)
            meta[f"{name}.greedy_min_margin"] = f"{margin:.6g}"
            meta[f"{name}.cached_greedy_agrees"] = str(cached == greedy)
            meta[f"{name}.vl_max_abs_diff"] = f"{vl_diff:.3g}"
            print(f"{name}: {len(ids)} tokens, greedy {greedy[:8]}..., min margin {margin:.4f}, "
                  f"cached greedy agrees {cached == greedy}, VL layout max |diff| {vl_diff:.3g}, "
                  f"smallest prompt-position margin {float(tensors[name + '.margin'].min()):.4g}")

    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    save_file(tensors, args.out, metadata=meta)
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)")


if __name__ == "__main__":
    main()
