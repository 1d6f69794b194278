#!/usr/bin/env python3
"""Hugging Face golden logits for models/tiny-qwen3-next (issue #25).

Loads the tiny Qwen3-Next checkpoint (scripts/make_tiny_qwen3_next.py) with transformers' own
Qwen3NextForCausalLM.from_pretrained, runs it on the CPU in float32 (eager attention, eager
experts, the torch fallbacks of the DeltaNet ops: torch_causal_conv1d_update / F.conv1d,
torch_chunk_gated_delta_rule for a prompt, torch_recurrent_gated_delta_rule for cached one-token
steps, Qwen3NextRMSNormGated), and writes one file, tests/data/golden/qwen3_next_golden.safetensors
(read by tests/model/test_qwen3_next_model.cpp), in the layout of qwen3_5_golden.py's:

  {name}.input_ids     int64 [T]
  {name}.logits_cols   float32 [T, 512]  logits of every position at vocab ids 0, 16, 32, ...
  {name}.logits_last4  float32 [min(4, T), vocab]  full logits of the last positions
  {name}.argmax        int64 [T]  top-1 id of every position (over the full vocab)
  {name}.margin        float32 [T] top-1 minus top-2 logit of every position
  {name}.greedy_ids    int64 [32] greedy continuation, each step a full forward (no cache)
  __metadata__         versions, the activations read from the reference code (output gate,
                       shared-expert gate), which DeltaNet paths ran, and per prompt the greedy
                       run's smallest margin, whether the cached (recurrent decode) greedy run
                       agrees, and the smallest router top-k margin (k-th minus (k+1)-th router
                       logit over the sparse layers and positions)

Prompts: those of qwen3_5_golden.py: tiny-qwen3's golden prompt p1_class (32 real token ids) and
seeded random sequences of 100 ids (two chunks of 64 in the chunked delta rule, the second
partial) and 200 ids.

Checks, each fatal (non-zero exit): transformers >= 5; the config as transformers reads it
(layer types, head_dim, partial rotary, expert counts and widths); every weight transformers
reports missing, unexpected or mismatched at load (our checkpoint names would be wrong); every
tensor of the checkpoint found in the loaded model with the same values (the per-expert
gate_proj / up_proj / down_proj through transformers' fused gate_up_proj / down_proj when it
fuses them) and no model parameter left uncovered; the reference code still gating with
torch.sigmoid. Nothing is written unless all pass.

Needs torch, transformers >= 5.x with qwen3_next (5.17 was the reference) and safetensors; no GPU
(it runs on the CPU even where one is visible). From the repository root:

  python3 scripts/goldens/qwen3_next_golden.py \
      [--out tests/data/golden/qwen3_next_golden.safetensors]
"""
import argparse
import inspect
import json
import os
import random
import re
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import Qwen3NextForCausalLM
from transformers.models.qwen3_next import modeling_qwen3_next as m

GREEDY_STEPS = 32
COL_STRIDE = 16
LAST_ROWS = 4
# What scripts/make_tiny_qwen3_next.py writes; transformers must read the config so.
EXPECT = {
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "head_dim": 256,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 16,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 48,
    "norm_topk_prob": True,
    "tie_word_embeddings": False,
}


def fail(msg):
    print(f"FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


def prompts(repo):
    with open(os.path.join(repo, "models/tiny-qwen3/golden/golden_index.json")) as f:
        index = json.load(f)
    out = [(p["name"], list(p["input_ids"])) for p in index["prompts"] if p["name"] == "p1_class"]
    if len(out) != 1:
        fail("models/tiny-qwen3/golden/golden_index.json has no prompt p1_class")
    rng = random.Random(35)  # qwen3_5_golden.py's prompts
    out.append(("r100", [rng.randrange(8192) for _ in range(100)]))
    out.append(("r200", [rng.randrange(8192) for _ in range(200)]))
    return out


def activations():
    """The gates' activations, read from the reference code."""
    attn = inspect.getsource(m.Qwen3NextAttention.forward)
    if "torch.sigmoid(gate)" not in attn:
        fail("Qwen3NextAttention.forward: no 'torch.sigmoid(gate)'; check the output gate:\n"
             + attn)
    moe = inspect.getsource(m.Qwen3NextSparseMoeBlock.forward)
    if not re.search(r"sigmoid\(\s*self\.shared_expert_gate\(", moe):
        fail("Qwen3NextSparseMoeBlock.forward: no 'sigmoid(self.shared_expert_gate(...))'; check "
             "the shared expert's gate:\n" + moe)
    return "sigmoid", "sigmoid"


def check_config(cfg):
    bad = {k: (getattr(cfg, k, None), v) for k, v in EXPECT.items() if getattr(cfg, k, None) != v}
    rp = getattr(cfg, "rope_parameters", None) or {}
    factor = rp.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", None))
    if factor != 0.25:
        bad["partial_rotary_factor"] = (factor, 0.25)
    theta = rp.get("rope_theta", getattr(cfg, "rope_theta", None))
    if theta is None or float(theta) != 1e7:
        bad["rope_theta"] = (theta, 1e7)
    if bad:
        fail(f"config as transformers reads it differs (got, expected): {bad}")
    print(f"config: layer_types {cfg.layer_types}, head_dim {cfg.head_dim}, "
          f"rotary factor {factor}, {cfg.num_experts} experts top-{cfg.num_experts_per_tok} + shared expert "
          f"{cfg.shared_expert_intermediate_size}")


def load(path):
    kwargs = dict(dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    try:
        model, info = Qwen3NextForCausalLM.from_pretrained(
            path, experts_implementation="eager", **kwargs)
        experts = "eager"
    except (TypeError, ValueError) as e:
        print(f"experts_implementation='eager' refused ({str(e)[:120]}); default experts")
        model, info = Qwen3NextForCausalLM.from_pretrained(path, **kwargs)
        experts = "default"
    problems = {k: v for k, v in info.items() if v}
    for k, v in problems.items():
        print(f"transformers reports {k}: {v}", file=sys.stderr)
    if problems:
        fail(f"{path} does not load cleanly into Qwen3NextForCausalLM (checkpoint names or shapes "
             f"are wrong): {sorted(problems)}")
    return model.eval(), experts


def check_weights(model, path):
    """Every checkpoint tensor is in the model with the same values; every parameter is covered."""
    ckpt = load_file(os.path.join(path, "model.safetensors"))
    params = dict(model.named_parameters(remove_duplicate=False))
    covered, problems = set(), []
    expert = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
    for name, t in sorted(ckpt.items()):
        t = t.float()
        if name in params:
            got = params[name].detach().float()
            covered.add(name)
        elif (mm := expert.match(name)) is not None:
            base, e, proj = mm.group(1), int(mm.group(2)), mm.group(3)
            inter = t.shape[0] if proj != "down_proj" else t.shape[1]
            if proj == "down_proj" and base + ".down_proj" in params:
                covered.add(base + ".down_proj")
                got = params[base + ".down_proj"].detach().float()[e]
            elif proj != "down_proj" and base + ".gate_up_proj" in params:
                covered.add(base + ".gate_up_proj")
                both = params[base + ".gate_up_proj"].detach().float()[e]  # [2 · inter, hidden]
                got = both[:inter] if proj == "gate_proj" else both[inter:]
            else:
                problems.append(f"{name}: no parameter {base}.{{gate_up_proj,down_proj}} or {name}")
                continue
        else:
            problems.append(f"{name}: not a parameter of the model")
            continue
        if tuple(got.shape) != tuple(t.shape):
            problems.append(f"{name}: shape {tuple(t.shape)} in the checkpoint, "
                            f"{tuple(got.shape)} in the model")
        elif not torch.equal(got, t):
            problems.append(f"{name}: values differ (max |diff| {float((got - t).abs().max())})")
    uncovered = sorted(set(params) - covered)
    if uncovered:
        problems.append(f"parameters not from the checkpoint: {uncovered}")
    if problems:
        fail("checkpoint and loaded model disagree:\n  " + "\n  ".join(problems))
    print(f"weights: {len(ckpt)} checkpoint tensors found in the model with equal values; "
          f"{len(covered)} parameters, all covered")


def torch_paths(model):
    """The torch fallbacks of the DeltaNet ops on every linear layer, whatever optional kernels
    (fla, causal-conv1d: CUDA only) this machine has; returns what was changed."""
    changed = set()
    for layer in model.model.layers:
        la = getattr(layer, "linear_attn", None)
        if la is None:
            continue
        for attr, fallback in (("causal_conv1d_fn", None),
                               ("causal_conv1d_update", "torch_causal_conv1d_update"),
                               ("chunk_gated_delta_rule", "torch_chunk_gated_delta_rule"),
                               ("recurrent_gated_delta_rule", "torch_recurrent_gated_delta_rule")):
            if not hasattr(la, attr):  # 5.17 picks some of these per call: its torch path then
                changed.add(f"{attr} absent")
                continue
            want = None if fallback is None else getattr(m, fallback)
            if getattr(la, attr) is not want:
                setattr(la, attr, want)
                changed.add(attr)
        if type(la.norm) is not m.Qwen3NextRMSNormGated:
            norm = m.Qwen3NextRMSNormGated(la.head_v_dim, eps=la.layer_norm_epsilon)
            with torch.no_grad():
                norm.weight.copy_(la.norm.weight.detach().float().cpu())
            la.norm = norm
            changed.add("norm")
    if any(c.endswith("absent") for c in changed):
        la = next(l.linear_attn for l in model.model.layers if hasattr(l, "linear_attn"))
        print("linear_attn attributes:",
              [a for a in dir(la) if "conv" in a or "delta" in a or "fast" in a])
    return sorted(changed)


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
    ap.add_argument("--model", default="models/tiny-qwen3-next")
    ap.add_argument("--out", default="tests/data/golden/qwen3_next_golden.safetensors")
    args = ap.parse_args()
    if int(transformers.__version__.split(".")[0]) < 5:
        fail(f"transformers {transformers.__version__}: need 5.x")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))

    attn_act, shared_act = activations()
    model, experts = load(args.model)
    cfg = model.config
    check_config(cfg)
    check_weights(model, args.model)
    changed = torch_paths(model)
    how = "replaced: " + ", ".join(changed) if changed else "already"
    print(f"DeltaNet ops: torch fallbacks ({how})")

    # Router margins: a pre-hook on each sparse layer's router (mlp.gate, with .weight [E, hidden]).
    margins = []

    def hook(module, inputs):
        h = inputs[0].reshape(-1, module.weight.shape[1]).float()
        logits = torch.nn.functional.linear(h, module.weight.float())
        top = torch.topk(logits, cfg.num_experts_per_tok + 1, dim=-1).values
        margins.append(float((top[:, -2] - top[:, -1]).min()))

    n_sparse = 0
    for layer in model.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and getattr(gate, "weight", None) is not None and \
                gate.weight.shape[0] == cfg.num_experts:
            gate.register_forward_pre_hook(hook)
            n_sparse += 1
    if n_sparse != 4:
        fail(f"expected 4 sparse layers with a router, found {n_sparse}")

    tensors, meta = {}, {
        "compute": f"transformers Qwen3NextForCausalLM.from_pretrained, bf16 weights loaded with "
                   f"dtype=float32, attn_implementation=eager, experts {experts}, CPU float32, "
                   f"torch fallbacks of the DeltaNet ops",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "output_gate_activation": attn_act,
        "shared_expert_gate_activation": shared_act,
        "deltanet_replaced": ",".join(changed),
    }
    cols = torch.arange(0, cfg.vocab_size, COL_STRIDE)
    all_agree = True
    with torch.no_grad():
        for name, ids in prompts(os.getcwd()):
            margins.clear()
            x = torch.tensor([ids])
            logits = model(x, use_cache=False).logits[0].float()
            router_margin = min(margins)
            if not torch.isfinite(logits).all():
                fail(f"{name}: non-finite logits")
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
            agree = cached == greedy
            all_agree = all_agree and agree
            tensors[f"{name}.greedy_ids"] = torch.tensor(greedy, dtype=torch.int64)
            meta[f"{name}.greedy_min_margin"] = f"{margin:.6g}"
            meta[f"{name}.cached_greedy_agrees"] = str(agree)
            meta[f"{name}.min_router_margin"] = f"{router_margin:.6g}"
            print(f"{name}: {len(ids)} tokens, greedy {greedy[:8]}..., min margin {margin:.4f}, "
                  f"cached greedy agrees {agree}, router margin {router_margin:.4g}, "
                  f"smallest prompt-position margin {float(tensors[name + '.margin'].min()):.4g}")

    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    save_file(tensors, args.out, metadata=meta)
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes): "
          f"{', '.join(sorted(tensors))}")
    if not all_agree:
        print("WARNING: transformers' cached greedy run differs from the uncached one on some "
              "prompt (see *.cached_greedy_agrees); the golden holds the uncached one",
              file=sys.stderr)


if __name__ == "__main__":
    main()
