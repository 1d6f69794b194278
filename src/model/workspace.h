// StepWorkspace: the activations of one step in the backend's memory, reused across steps (grown,
// never shrunk, by doubling), and the host arrays the step runner stages (model/step_runner.h).
// The buffers a config needs only: the dense FFN's where some layer is dense, the MoE scratch
// where some layer is sparse (and the shared expert's where it has one), the DeltaNet's in a
// hybrid. Not thread-safe (one per runner).
#pragma once

#include <cstdint>
#include <vector>

#include "core/device.h"
#include "core/status.h"
#include "format/model_config.h"
#include "kernels/backend.h"

namespace oscar::model {

struct StepWorkspace {
  int64_t rows = 0, logit_rows = 0;
  DeviceBuffer x, h, o;            // [n, hidden]
  DeviceBuffer q, q_rot, attn;     // [n, q_dim]
  DeviceBuffer k, v;               // [n, kv_dim]
  DeviceBuffer gate, up;           // [n, intermediate] (a model with a dense FFN)
  DeviceBuffer router_logits;      // [n, n_experts] (a model with sparse layers)
  DeviceBuffer expert_ids;         // [n, top_k] int32
  DeviceBuffer expert_weights;     // [n, top_k]
  DeviceBuffer moe_work;           // kernels::moe_ffn_work_bytes(n, ...) bytes
  DeviceBuffer shared_gate, shared_up;  // [n, shared_inter] (Qwen3-Next's shared expert)
  DeviceBuffer shared_out;              // [n, hidden]
  DeviceBuffer shared_score;            // [n]
  DeviceBuffer logits;             // [n_logit_rows, vocab]
  DeviceBuffer attn_gate;          // [n, q_dim] (Qwen3.5's gated attention)
  DeviceBuffer lin_qkv, lin_conv;  // [n, conv_dim] (Gated DeltaNet layers)
  DeviceBuffer lin_z, lin_o;       // [n, value_dim]
  DeviceBuffer lin_ab;             // [4, n, heads_v]
  std::vector<float> cos, sin;     // [n, rotary_dim / 2] RoPE of each row's position (host)
  std::vector<uint8_t> staging;    // host bytes of the plan's arrays, uploaded in one copy
  DeviceBuffer plan;               // their device copy
  std::vector<float> host;         // observer copies on a device backend

  // Room for n rows, n_logits of them with logits (buffers that grow move: pointers into them,
  // a recorded graph's included, are stale).
  Status reserve(kernels::Backend& be, int64_t n, int64_t n_logits, const format::ModelConfig& c);
};

}  // namespace oscar::model
