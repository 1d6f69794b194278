#!/usr/bin/env python3
"""Hugging Face golden logits for models/tiny-qwen3-moe (issue #25).

Runs the tiny Qwen3-MoE checkpoint (scripts/make_tiny_moe.py) through transformers'
Qwen3MoeForCausalLM in float32 (eager attention, eager experts, TF32 off) and writes, in the layout of
models/tiny-qwen3/golden (read by tests/model/test_moe_model.cpp, MoeModel.HuggingFaceGolden):

  OUT/logits.safetensors   {name}.input_ids int64 [T], {name}.logits_last8 float32 [min(8, T), vocab],
                           {name}.greedy_ids int64 [32] (each step a full forward of prompt + previous)
  OUT/golden_index.json    compute, versions, and per prompt: name, n_tokens, input_ids,
                           logits_positions, greedy_top5 (per step, the top 5 [id, logit]),
                           min_top1_top2_margin, min_router_margin (over the sparse layers and
                           positions of the prompt's forward: the k-th minus the (k+1)-th router
                           logit; a tiny one would make the expert choice fragile)

Prompts: tiny-qwen3's golden prompts p0-p2 (real token ids, models/tiny-qwen3/golden) and a
seeded random sequence of 300 ids.

Needs torch, transformers >= 5 and safetensors (a GPU is used when visible, else the CPU). From
the repository root:

  python3 scripts/goldens/qwen3_moe_golden.py --model models/tiny-qwen3-moe \
      --out models/tiny-qwen3-moe/golden
"""
import argparse
import json
import os
import random
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import Qwen3MoeForCausalLM

GREEDY_STEPS = 32


def prompts(repo):
    out = []
    with open(os.path.join(repo, "models/tiny-qwen3/golden/golden_index.json")) as f:
        index = json.load(f)
    for p in index["prompts"]:
        if p["name"] in ("p0_short_code", "p1_class", "p2_chatml_specials"):
            out.append((p["name"], list(p["input_ids"])))
    rng = random.Random(2025)
    out.append(("p3_random_300", [rng.randrange(8192) for _ in range(300)]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/tiny-qwen3-moe")
    ap.add_argument("--out", default="models/tiny-qwen3-moe/golden")
    args = ap.parse_args()
    if int(transformers.__version__.split(".")[0]) < 5:
        sys.exit(f"transformers {transformers.__version__}: need 5.x")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"

    # The eager experts backend (a loop over the selected experts in float32), as the reference;
    # transformers before 5.3 has no experts backends (its loop is the eager one).
    kwargs = dict(dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    try:
        model, info = Qwen3MoeForCausalLM.from_pretrained(
            args.model, experts_implementation="eager", **kwargs)
    except (TypeError, ValueError):
        model, info = Qwen3MoeForCausalLM.from_pretrained(args.model, **kwargs)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f"checkpoint does not load cleanly: {problems}")
    model = model.to(device).eval()
    cfg = model.config

    # Router margins: a pre-hook on each sparse layer's router (mlp.gate, a Linear in transformers
    # 4, a TopKRouter with .weight in 5) recomputes its logits from its input.
    margins = []

    def hook(module, inputs):
        h = inputs[0].reshape(-1, module.weight.shape[1]).float()
        logits = torch.nn.functional.linear(h, module.weight.float())
        top = torch.topk(logits, cfg.num_experts_per_tok + 1, dim=-1).values
        margins.append(float((top[:, -2] - top[:, -1]).min()))

    n_sparse = 0
    for layer in model.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and hasattr(gate, "weight") and gate.weight.shape[0] == cfg.num_experts:
            gate.register_forward_pre_hook(hook)
            n_sparse += 1
    if n_sparse != 2:
        sys.exit(f"expected 2 sparse layers (mlp_only_layers {cfg.mlp_only_layers}), found {n_sparse}")

    tensors, index = {}, {
        "compute": f"transformers Qwen3MoeForCausalLM, bf16 weights loaded with dtype=float32, "
                   f"attn_implementation=eager, experts_implementation=eager, {device} fp32 "
                   f"with TF32 disabled",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "prompts": [],
    }
    with torch.no_grad():
        for name, ids in prompts(os.getcwd()):
            margins.clear()
            x = torch.tensor([ids], device=device)
            logits = model(x, use_cache=False).logits[0].float().cpu()
            router_margin = min(margins)
            rows = min(8, len(ids))
            tensors[f"{name}.input_ids"] = torch.tensor(ids, dtype=torch.int64)
            tensors[f"{name}.logits_last8"] = logits[-rows:].contiguous()
            seq, greedy, top5, margin = list(ids), [], [], float("inf")
            last = logits[-1]
            for _ in range(GREEDY_STEPS):
                v, i = torch.topk(last, 5)
                top5.append([[int(a), float(b)] for a, b in zip(i, v)])
                margin = min(margin, float(v[0] - v[1]))
                greedy.append(int(i[0]))
                seq.append(int(i[0]))
                last = model(torch.tensor([seq], device=device), use_cache=False).logits[0, -1].float().cpu()
            tensors[f"{name}.greedy_ids"] = torch.tensor(greedy, dtype=torch.int64)
            index["prompts"].append({
                "name": name, "n_tokens": len(ids), "input_ids": ids,
                "logits_positions": list(range(len(ids) - rows, len(ids))),
                "greedy_top5": top5, "min_top1_top2_margin": margin,
                "min_router_margin": router_margin,
            })
            print(f"{name}: {len(ids)} tokens, greedy {greedy[:8]}..., top1-top2 margin "
                  f"{margin:.4f}, router margin {router_margin:.4g}")

    os.makedirs(args.out, exist_ok=True)
    save_file(tensors, os.path.join(args.out, "logits.safetensors"))
    with open(os.path.join(args.out, "golden_index.json"), "w") as f:
        json.dump(index, f, indent=1)
    print(f"wrote {args.out}/logits.safetensors and golden_index.json")


if __name__ == "__main__":
    main()
