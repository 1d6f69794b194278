// KvOpParams: the engine-wide part of the KV ops' parameters (kernels/kv_append.h, decode_attn.h,
// prefill_attn.h, demote_pages.h): the page layout, the history codec, the key and query
// transforms, the scale and the pools' bases. One KvCacheSpec and one pair of pools serve every
// sequence of an engine, so these are the same for all of them: the step plan carries one copy
// (kv/step_plan.h), and the step runner fills in the rest (rows, tables, layer, query heads).
// Not here: anything of one sequence (its pages, its slots).
#pragma once

#include "kernels/decode_attn.h"
#include "kernels/demote_pages.h"
#include "kernels/kv_append.h"
#include "kernels/prefill_attn.h"
#include "kv/page_pool.h"
#include "kv/sequence_cache.h"

namespace oscar::kv {

struct KvOpParams {
  kernels::KvAppendParams append;               // layer 0
  kernels::RotateQueriesParams rotate_queries;  // layer 0, the query rotations only
  kernels::DecodeAttnParams decode;             // layer 0, one sequence, n_heads_q unset
  kernels::PrefillAttnParams prefill;           // layer 0, n_heads_q unset
  kernels::DemotePagesParams demote;
};

// hist_pool: null in the unquantized modes (no history region).
KvOpParams kv_op_params(const KvCacheSpec& spec, PagePool& exact_pool, PagePool* hist_pool,
                        AttendMode mode);

}  // namespace oscar::kv
