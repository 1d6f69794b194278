// StepPlan: everything one forward step reads, made once per step from the chunks the scheduler
// chose, after their pages are reserved (SequenceCache::reserve): the batch's token ids and
// positions, where each sequence's rows are, which rows produce logits, one CSR view of the KV
// cache per region (kernels/page_table.h) for the decode rows and one for the prefill rows, the
// exact-pool slot of every new token, the pages to demote after the forward pass, the engine-wide
// part of the KV ops' parameters (kv/kv_op_params.h) and, in a hybrid, each sequence's state
// slot. The model reads the plan and nothing else (never a sequence's cache); a device backend
// uploads its arrays (a few KB) in one copy.
//
// Order: decode sequences (one new token, not kivi2) come first, so that their rows are one
// contiguous block [0, n_decode) that decode attention serves in one call; prefill chunks follow.
// `chunk` maps plan sequences back to the caller's order.
//
// The step's life: reserve (caller) -> make() -> forward -> demote_pages -> commit() -> sample.
// Not here: choosing the chunks (engine/scheduler), the bytes (the backend's ops).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "kernels/distinct_pages.h"
#include "kv/kv_op_params.h"
#include "kv/page_table.h"
#include "kv/sequence_cache.h"

namespace oscar::kv {

struct StepChunk {
  SequenceCache* cache = nullptr;   // reserve(tokens.size()) done
  std::span<const int32_t> tokens;  // at positions cache->n_tokens() ...
  bool all_logits = false;          // logits for every token (else only the last)
};

class StepPlan {
 public:
  // A plan over the chunks (each with at least one token and pages reserved for exactly its
  // tokens). All caches share one KvCacheSpec, one pair of page pools and one state pool (or
  // none).
  static StepPlan make(std::span<const StepChunk> chunks, AttendMode mode);

  int32_t n_seqs() const { return static_cast<int32_t>(chunk.size()); }
  int32_t n_rows() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t n_logit_rows() const { return static_cast<int32_t>(logit_rows.size()); }
  int32_t n_decode_rows() const { return n_decode; }

  // Marks every sequence whose demotions all succeeded (demote_status [n_demote] from
  // kernels::demote_pages, kDemoteOk = 0) as committed; the others keep their tokens staged and
  // get an error in per_chunk (indexed like the caller's chunks, resized to fit).
  void commit(std::span<const int32_t> demote_status, std::vector<Status>* per_chunk) const;

  AttendMode mode = AttendMode::kPrefill;
  int32_t n_decode = 0;                  // decode sequences (and rows): [0, n_decode)
  std::vector<int32_t> chunk;            // [n_seqs] the caller's chunk index of each sequence
  std::vector<SequenceCache*> caches;    // [n_seqs]
  std::vector<int32_t> cu_seqlens;       // [n_seqs + 1] rows of sequence s: [cu[s], cu[s+1])
  std::vector<int64_t> pos0;             // [n_seqs] position of each sequence's first row
  std::vector<int32_t> token_ids;        // [n_rows]
  std::vector<int32_t> positions;        // [n_rows]
  std::vector<int64_t> write_slots;      // [n_rows] exact-pool slot of each row's K/V
  std::vector<int32_t> logit_rows;       // [n_out] rows whose logits are computed, in seq order
  std::vector<int32_t> cu_logits;        // [n_seqs + 1] seq s's rows of the logits output
  // Decode sequences [0, n_decode): three tables over n_decode sequences.
  PageTableBuilder dec_sinks{1}, dec_hist{1}, dec_recent{1};
  // Prefill sequences [n_decode, n_seqs): three tables over them (their rows and positions are
  // cu_seqlens / pos0 from n_decode on).
  PageTableBuilder pre_sinks{1}, pre_hist{1}, pre_recent{1};
  // pre_hist's distinct pages (sequences sharing a cached prefix share them), for a device
  // kernel that expands each history page once (PrefillAttnParams::hist_unique).
  kernels::DistinctPages pre_hist_distinct;
  // Demotions after the forward pass: history page dst[i] gets exact page src[i] of seq[i].
  std::vector<int32_t> demote_src, demote_dst, demote_seq;
  // Engine-wide: the KV ops' layout, codec, transforms and pool bases (layer 0; the runner sets
  // the rest), and the hybrids' DeltaNet state pool (null without one).
  KvOpParams ops;
  StatePool* state_pool = nullptr;
  std::vector<int32_t> state_slots;      // [n_seqs] each sequence's StatePool slot, -1 = none
};

}  // namespace oscar::kv
