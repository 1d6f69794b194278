#!/usr/bin/env python3
"""Hugging Face golden for the Gated DeltaNet ops (src/kernels/gated_delta.h; issue #25 item 3).

Runs transformers' own functions from transformers.models.qwen3_next.modeling_qwen3_next on small
seeded float32 inputs (CPU, deterministic) and writes inputs and outputs, in oscar's layouts, to
one safetensors file (about 0.5 MB) read by tests/kernels/test_gated_delta.cpp
(GatedDeltaGolden.Transformers):

  conv.x [B, T, C], conv.w [C, K], conv.state_in [B, K-1, C]    inputs
  conv.y [B, T, C], conv.state_out [B, K-1, C]                  torch_causal_conv1d_update with a
                                                                state (SiLU); transformers keeps K
                                                                state entries, the oldest unread:
                                                                it is random here, and dropped
  conv.y_prefill [B, T, C]                                      the prefill path, zero state:
                                                                silu(conv1d(x, padding K-1)[:T])
  gates.a, gates.b [B, T, Hv], gates.A_log, gates.dt_bias [Hv]  inputs
  gates.g, gates.beta [B, T, Hv]                                -exp(A_log)·softplus(a + dt_bias),
                                                                sigmoid(b), as the layer computes
  delta.q, delta.k [B, T, Hk, dk], delta.v [B, T, Hv, dv],      inputs (q, k before the layer's
  delta.state_in [B, Hv, dk, dv]                                repeat_interleave; g, beta above)
  delta.chunk.o [B, T, Hv, dv], delta.chunk.state               torch_chunk_gated_delta_rule
  delta.recurrent.o, delta.recurrent.state                      torch_recurrent_gated_delta_rule
                                                                (both use_qk_l2norm_in_kernel=True)
  norm_gated.x, .z [R, dv], .w [dv], .y                         Qwen3NextRMSNormGated (eps 1e-6)
  norm_zc.x [R, D], .w [D], .y                                  Qwen3NextRMSNorm (eps 1e-6)

Shapes: B = 2 sequences of T = 100 tokens (two chunks of 64, the second partial), Hk = 2, Hv = 4
(head repetition), dk = 32, dv = 16, C = 96, K = 4.

Needs torch, transformers >= 5 and safetensors. From the repository root:

  python3 scripts/goldens/gated_delta_golden.py --out tests/data/golden/gated_delta.safetensors
"""
import argparse
import os

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from transformers.models.qwen3_next import modeling_qwen3_next as m

B, T, HK, HV, DK, DV, C, K = 2, 100, 2, 4, 32, 16, 96, 4


def conv_update_reference(x, state, w):
    """The decode-time causal conv with a state, [B, C, T] with a [B, C, K] state updated in
    place: transformers' torch_causal_conv1d_update where this version has it (5.17 dropped it:
    its layers call the causal_conv1d package's kernel, or recompute the prefill conv); else the
    same computation here (the state's K columns then x, a depthwise conv, the last T outputs,
    SiLU; the state keeps the last K columns)."""
    fn = getattr(m, "torch_causal_conv1d_update", None)
    if fn is not None:
        print("torch_causal_conv1d_update: transformers'")
        return fn(x, state, w, None, "silu")
    print("torch_causal_conv1d_update: not in this transformers; the conv is computed here")
    T, K = x.shape[-1], w.shape[-1]
    full = torch.cat([state, x], dim=-1)
    state.copy_(full[:, :, -K:])
    y = F.conv1d(full, w.unsqueeze(1), groups=x.shape[1])
    return F.silu(y[:, :, -T:])


def transformers_fn(name):
    """transformers' own function `name` from modeling_qwen3_next (the torch fallbacks its layer
    runs without the flash-linear-attention kernels)."""
    fn = getattr(m, name, None)
    if fn is None:
        near = sorted(a for a in dir(m) if "conv1d" in a or "delta_rule" in a)
        raise SystemExit(f"transformers {transformers.__version__} has no {name}; near: {near}")
    return fn


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/data/golden/gated_delta.safetensors")
    ap.add_argument("--seed", type=int, default=20251203)
    args = ap.parse_args()
    major = int(transformers.__version__.split(".")[0])
    if major < 5:
        raise SystemExit(f"transformers >= 5 needed, found {transformers.__version__}")
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    f32 = torch.float32
    out = {}

    # Conv: transformers' layout is [B, C, T] with a [B, C, K] state.
    x = torch.randn(B, T, C, dtype=f32)
    w = torch.randn(C, K, dtype=f32) * 0.5
    state_hf = torch.randn(B, C, K, dtype=f32)
    state_in = state_hf[:, :, 1:].clone()  # the K-1 entries the conv reads
    st = state_hf.clone()
    y = conv_update_reference(x.transpose(1, 2).contiguous(), st, w)
    out["conv.x"] = x
    out["conv.w"] = w
    out["conv.state_in"] = state_in.transpose(1, 2)
    out["conv.y"] = y.transpose(1, 2)
    out["conv.state_out"] = st[:, :, 1:].transpose(1, 2)
    conv = torch.nn.Conv1d(C, C, K, groups=C, padding=K - 1, bias=False)
    with torch.no_grad():
        conv.weight.copy_(w.unsqueeze(1))
        out["conv.y_prefill"] = F.silu(conv(x.transpose(1, 2))[:, :, :T]).transpose(1, 2)

    # Gates, as Qwen3NextGatedDeltaNet.forward computes them.
    a = torch.randn(B, T, HV, dtype=f32) * 2
    b = torch.randn(B, T, HV, dtype=f32) * 2
    A_log = torch.log(torch.empty(HV, dtype=f32).uniform_(0.5, 16))
    dt_bias = torch.randn(HV, dtype=f32)
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
    beta = b.sigmoid()
    out.update({"gates.a": a, "gates.b": b, "gates.A_log": A_log, "gates.dt_bias": dt_bias,
                "gates.g": g, "gates.beta": beta})

    # Delta rule: q, k repeated over the value heads as the layer does.
    q = torch.randn(B, T, HK, DK, dtype=f32)
    k = torch.randn(B, T, HK, DK, dtype=f32)
    v = torch.randn(B, T, HV, DV, dtype=f32)
    s0 = torch.randn(B, HV, DK, DV, dtype=f32) * 0.5
    qr = q.repeat_interleave(HV // HK, dim=2)
    kr = k.repeat_interleave(HV // HK, dim=2)
    out.update({"delta.q": q, "delta.k": k, "delta.v": v, "delta.state_in": s0})
    chunk_rule = transformers_fn("torch_chunk_gated_delta_rule")
    o, s = chunk_rule(qr, kr, v, g=g, beta=beta, chunk_size=64, initial_state=s0.clone(),
                      output_final_state=True, use_qk_l2norm_in_kernel=True)
    out["delta.chunk.o"], out["delta.chunk.state"] = o, s
    recurrent_rule = transformers_fn("torch_recurrent_gated_delta_rule")
    o, s = recurrent_rule(qr, kr, v, g=g, beta=beta, initial_state=s0.clone(),
                          output_final_state=True, use_qk_l2norm_in_kernel=True)
    out["delta.recurrent.o"], out["delta.recurrent.state"] = o, s

    # Norms.
    R, D = 24, 64
    norm = m.Qwen3NextRMSNormGated(DV, eps=1e-6)
    xg, zg = torch.randn(R, DV, dtype=f32) * 2, torch.randn(R, DV, dtype=f32) * 2
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(DV))
        out["norm_gated.y"] = norm(xg, zg)
    out.update({"norm_gated.x": xg, "norm_gated.z": zg, "norm_gated.w": norm.weight.detach()})
    zc = m.Qwen3NextRMSNorm(D, eps=1e-6)
    xz = torch.randn(R, D, dtype=f32) * 2
    with torch.no_grad():
        zc.weight.copy_(0.1 * torch.randn(D))
        out["norm_zc.y"] = zc(xz)
    out.update({"norm_zc.x": xz, "norm_zc.w": zc.weight.detach()})

    tensors = {n: t.detach().to(f32).contiguous() for n, t in out.items()}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_file(tensors, args.out, metadata={
        "transformers": transformers.__version__, "torch": torch.__version__,
        "seed": str(args.seed), "source": "scripts/goldens/gated_delta_golden.py"})
    size = os.path.getsize(args.out)
    print(f"wrote {args.out}: {len(tensors)} tensors, {size} bytes")
    if size >= 1 << 20:
        raise SystemExit("golden over 1 MB")


if __name__ == "__main__":
    main()
