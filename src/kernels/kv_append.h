// kv_append: stores one layer's new K/V rows of a whole step into their exact pages, with the key
// transform of OSCAR.md §1/§3 applied on the way (keys are stored as (k − μ_K)·R_K, so every
// region holds keys in the rotated basis). rotate_queries: the query side of the same transform
// (q·R_Q, R_Q = R_K⁻ᵀ; = R_K for orthogonal rotations), applied before attention.
//
// Slots come from the step plan (kv/step_plan.h): token i of the step goes to exact page
// slots[i] / page_size, slot slots[i] % page_size. Not here: which pages a token gets (the
// planner), BF16 rounding policy (exact_elem_bytes: 2 = bf16 round-to-nearest-even, 4 = f32).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "kernels/kv_layout.h"

namespace oscar::kernels {

struct KvAppendParams {
  KvPageLayout layout;
  int32_t layer = 0;
  int64_t n_tokens = 0;
  const float* k = nullptr;       // [n_tokens, n_heads_kv, head_dim], after k_norm and RoPE
  const float* v = nullptr;       // [n_tokens, n_heads_kv, head_dim]
  const int64_t* slots = nullptr; // [n_tokens] page_id * page_size + slot in the exact pool
  uint8_t* exact_pool = nullptr;  // [n_pages, layout.exact_page_bytes()]
  const float* k_mean = nullptr;      // [n_layers, n_heads_kv, head_dim] or null (no centring)
  const float* k_rotation = nullptr;  // [n_layers, n_heads_kv, head_dim, head_dim] or null
};

// CPU: rows in parallel over (token, head); the arithmetic of each row is fixed (centre, then
// out[c] = Σ_r x[r]·R[r, c] in r order), so the result does not depend on the thread count.
Status kv_append(const KvAppendParams& p);
Status kv_append_cuda(const KvAppendParams& p, void* stream);

struct RotateQueriesParams {
  int32_t layer = 0;
  int64_t n_rows = 0;
  int32_t n_heads_q = 0, n_heads_kv = 0, head_dim = 0;
  const float* q = nullptr;           // [n_rows, n_heads_q, head_dim]
  const float* q_rotation = nullptr;  // [n_layers, n_heads_kv, head_dim, head_dim]; null = copy
  float* out = nullptr;               // [n_rows, n_heads_q, head_dim]; may not alias q
};
Status rotate_queries(const RotateQueriesParams& p);
Status rotate_queries_cuda(const RotateQueriesParams& p, void* stream);

}  // namespace oscar::kernels
