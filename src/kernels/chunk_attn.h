// Causal attention of a chunk of queries over a sequence whose keys/values are read either
// exactly or dequantized, per query (OSCAR.md §4-§5):
//   query i sits at position pos0 + i and sees keys [0, pos0 + i];
//   key j < n_sink is read from the exact matrices; n_sink <= j < deq_end[i] from the
//   dequantized matrices; deq_end[i] <= j from the exact matrices.
// deq_end is non-decreasing in i. With deq_end[i] == hist_end for every i this is serving
// prefill (the chunk reads its own exact K/V); with deq_end[i] = history_end(pos0 + i) it is
// what decode would read at every position (perplexity evaluation).
//
// K/V are float matrices materialised by the caller (kv::SequenceCache) for one layer. The
// decode path over packed pages is kernels/decode_attn.h.
#pragma once

#include <cstdint>

#include "core/status.h"

namespace oscar::kernels {

struct ChunkAttnParams {
  int32_t n_queries = 0;
  int32_t n_heads_q = 0;
  int32_t n_heads_kv = 0;
  int32_t head_dim = 0;
  int32_t pos0 = 0;    // position of query 0; the key count is pos0 + n_queries
  int32_t n_sink = 0;
  float scale = 0.f;   // softmax scale, 1/sqrt(head_dim)
  const float* q = nullptr;        // [n_queries, n_heads_q, head_dim]
  const float* k_exact = nullptr;  // [n_heads_kv, ld_keys, head_dim], rows read where exact
  const float* v_exact = nullptr;  // [n_heads_kv, ld_keys, head_dim]
  const float* k_deq = nullptr;    // [n_heads_kv, ld_keys, head_dim], rows read in the INT2 zone
  const float* v_deq = nullptr;    // [n_heads_kv, ld_keys, head_dim]
  int64_t ld_keys = 0;             // row capacity per head (>= pos0 + n_queries)
  const int32_t* deq_end = nullptr;  // [n_queries], non-decreasing, each >= n_sink
  float* out = nullptr;            // [n_queries, n_heads_q, head_dim]
  // Fast path: a query's output independent of the other queries of the call and of pos0's
  // chunking (cpu/chunk_attn_invariant.cpp; README "Deterministic results"). The reference
  // ignores it.
  bool batch_invariant = false;
};

// Plain loops, double accumulation: defines "correct".
Status chunk_attn_ref(const ChunkAttnParams& p);
// Blocked matrix products (Eigen) and OpenMP threads over (head, query block); with
// batch_invariant, fixed-order per-query loops instead.
Status chunk_attn(const ChunkAttnParams& p);

}  // namespace oscar::kernels
