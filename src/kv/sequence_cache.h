// SequenceCache: the KV cache of one sequence in three regions (OSCAR.md §4):
//   sinks   tokens [0, n_sink)              exact pages (BF16; F32 in the reference mode)
//   history tokens [n_sink, hist_end)       INT2 pages (rotated, clipped, quantized, packed)
//   recent  tokens [hist_end, n_tokens)     exact pages, the last n_recent .. n_recent+page-1
// Pages come from two PagePools (kv/page_pool.h); their contents follow kernels/kv_layout.h.
// Keys are rotated by R_K when written (all regions hold rotated K) and queries by the same R_K
// before attention; the value rotation is folded into the model's weights (model/qwen3.h).
// With a bit plan (kv/bit_plan.h) each (layer, K/V, head) of the history has its own row width
// (4, 3, 2 or 1 bits per element; oscar4 / oscar3 are plans of one width); demotion, the decode
// kernel and the materialising path all follow it, and bytes() counts the pages as they are.
//
// SequenceCache is the host bookkeeping of one sequence: its page lists per region, reserve /
// commit, prefix adoption. The bytes are written and read by the batched kernel ops
// (kernels/kv_append.h, decode_attn.h, prefill_attn.h, demote_pages.h), which the step plan
// (kv/step_plan.h) drives for a whole batch. For one sequence alone (tests, tools) the cache also
// offers those ops directly: reserve(n) -> for each layer: write() then attend() -> commit(n),
// where commit() demotes full recent pages (one pass over all layers and heads).
// Not thread-safe; owned by one request.
//
// Hybrid models (Qwen3.5): the spec holds the full-attention layers only (ModelConfig::kv_layer
// maps a model layer to its cache layer); the Gated DeltaNet layers keep a fixed-size state in a
// StatePool slot (kv/state_pool.h) that this cache takes at its first reserve() and gives back in
// clear(). The forward pass advances that state in place, so it always matches n_tokens() plus
// the staged tokens of the step in flight; a failed step leaves it advanced, and its owner drops
// the cache (as after a failed commit). Prefix sharing needs the state after the shared prefix:
// adopt_prefix() takes a snapshot slot (kv/radix_cache.h, hybrid mode) and copies it into this
// sequence's slot; keep_state_snapshot() copies the state after the committed tokens into a
// second slot of this cache's own, which its owner hands to the prefix cache when it publishes
// the sequence's pages (the state of a failed step is never kept: only committed tokens count).
//
// kivi2 (the KIVI-style baseline, OSCAR.md §8; quant/kivi.h): same regions and windows, no
// rotation, no clipping. History pages are KIVI pages (kernels/kv_layout.h): keys per channel
// over 32-token blocks, values per token over groups of 32 channels, fp16 metadata, 3 bits per
// element (bytes() counts the pages: exactly 3.0 bits/element of history). validate() requires
// page_size to be a multiple of 32 (so pages hold whole key blocks; the engine default 16 must be
// overridden, e.g. --page-size 32), and since the windows are multiples of page_size, every block
// starts at n_sink + 32·b. Only complete blocks are ever quantized: a block leaves the exact
// recent window whole, at demotion. The decode-equivalent mode quantizes on the fly the same
// whole blocks demotion will. Single-token steps in kivi2 use the materialising chunk_attn path
// (there is no packed-page KIVI decode kernel); the result is the same attention.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/status.h"
#include "kernels/backend.h"
#include "kernels/decode_attn.h"
#include "kernels/demote_pages.h"
#include "kernels/kv_append.h"
#include "kernels/kv_codec.h"
#include "kernels/kv_layout.h"
#include "kernels/prefill_attn.h"
#include "kv/admission.h"  // RegionConfig
#include "kv/bit_plan.h"
#include "kv/page_pool.h"
#include "kv/page_table.h"
#include "kv/radix_cache.h"  // CachedPage
#include "kv/state_pool.h"
#include "quant/modes.h"

namespace oscar::kv {

// First token of the recent window once a sequence holds n_tokens tokens: full pages beyond the
// sinks are demoted as soon as the recent window would hold n_recent + page_size tokens, so it
// keeps between n_recent and n_recent + page_size - 1 tokens.
int64_t history_end(const RegionConfig& regions, int64_t n_tokens);

// What every sequence of one engine stores, and how. Immutable once caches exist.
struct KvCacheSpec {
  int32_t n_layers = 0;
  int32_t n_heads_kv = 0;
  int32_t head_dim = 0;
  int32_t group_size = 128;  // values per INT2 scale/min
  RegionConfig regions;
  quant::CacheMode mode = quant::CacheMode::kBF16;
  // [n_layers, n_heads_kv, head_dim, head_dim] key rotation (x' = x R); empty = none.
  std::vector<float> k_rotation;
  // Query-aware key scaling (OSCAR.md §1 "Key scaling"): keys are stored as (k − k_mean)·k_rotation
  // and queries read them as q·q_rotation, with q_rotation = k_rotation⁻ᵀ so that logits change
  // only by a per-query constant. q_rotation [n_layers, n_heads_kv, head_dim, head_dim], empty =
  // k_rotation (orthogonal rotations); k_mean [n_layers, n_heads_kv, head_dim], empty = none.
  std::vector<float> q_rotation;
  std::vector<float> k_mean;
  // [n_layers, n_heads_kv, head_dim, head_dim] value rotation, folded into v_proj/o_proj by the
  // model at load time; empty = none. The cache itself never applies it.
  std::vector<float> v_rotation;
  // [n_layers * n_heads_kv] clip quantile per group (OSCAR.md §1 "Clipping"); empty = no clip.
  std::vector<float> k_clip, v_clip;
  // Mixed-precision bit plan of the history rows (kv/bit_plan.h); null = every row INT2. Only for
  // the uniform INT2 modes (oscar, int2-naive, int2-hadamard); its shape must match the spec's.
  std::shared_ptr<const BitPlan> bit_plan;

  // Where the ops read the tensors above (rotations, centring, clips, the bit plan's arrays):
  // the host vectors themselves for the CPU backend; after upload_to(), copies in a device
  // backend's memory, shared by every copy of this spec. The op_* accessors give what the op
  // params must carry (SequenceCache::*_params); layout() / codec() stay host views for host code.
  struct DeviceTensors {
    DeviceBuffer k_rotation, q_rotation, k_mean, k_clip, v_clip, hist_bits, hist_row_prefix;
  };
  std::shared_ptr<const DeviceTensors> device_tensors;
  Status upload_to(kernels::Backend& backend);
  kernels::KvPageLayout op_layout() const;
  kernels::HistCodec op_codec() const;
  const float* op_query_rotations() const;
  const float* op_k_rotation() const;
  const float* op_k_mean() const;

  bool quantized() const;  // does the history region exist (INT2 modes)
  // [head_dim, head_dim] transform of the queries that read KV head `head`; nullptr = none.
  const float* query_rotation(int layer, int head) const;
  // All of them, [n_layers, n_heads_kv, head_dim, head_dim]; nullptr = none.
  const float* query_rotations() const;
  kernels::KvPageLayout layout() const;
  kernels::HistCodec codec() const;  // pointers into this spec
  Status validate() const;
  std::string describe() const;  // one line for logs
};

enum class AttendMode {
  kPrefill,           // the chunk reads its own exact K/V and the cache as it was
  kDecodeEquivalent,  // every query reads exactly what decode would read at its position
};

// Bytes a sequence holds, per region.
struct CacheBytes {
  int64_t sink = 0, history = 0, recent = 0;
  int64_t total() const { return sink + history + recent; }
};

// Scratch buffers for attend(), reused across layers and steps (one per thread of work).
struct AttendScratch {
  std::vector<float> q_rot;
};

class SequenceCache {
 public:
  // state_pool: the DeltaNet state slots of a hybrid model, else null (not owned).
  SequenceCache(const KvCacheSpec* spec, PagePool* exact_pool, PagePool* int2_pool,
                StatePool* state_pool = nullptr);
  ~SequenceCache();
  SequenceCache(const SequenceCache&) = delete;
  SequenceCache& operator=(const SequenceCache&) = delete;

  int64_t n_tokens() const { return n_tokens_; }
  int64_t hist_end() const { return hist_end_; }
  const KvCacheSpec& spec() const { return *spec_; }

  // Allocates the exact pages for n staged tokens and the INT2 pages commit(n) will need.
  // ResourceExhausted (nothing held) when a pool is short.
  Status reserve(int64_t n);
  // Gives back what reserve() took (the forward pass failed before write()).
  void unreserve();
  int64_t n_staged() const { return n_staged_; }
  // The hybrid models' DeltaNet state: the pool and this sequence's slot (-1 before the first
  // reserve(), or without a pool).
  StatePool* state_pool() const { return state_pool_; }
  // The page pools this cache takes pages from (every cache of one engine shares them).
  PagePool* exact_pool() const { return exact_pool_; }
  PagePool* int2_pool() const { return int2_pool_; }
  int32_t state_slot() const { return state_slot_; }

  // --- The batched path (kv/step_plan.h) -------------------------------------------------------
  // Exact-pool slot (page_id * page_size + slot) of the token at `pos` (a sink or recent token,
  // committed or staged).
  int64_t exact_slot(int64_t pos) const;
  // The sequence's tables for this step (staged tokens included): appends one sequence to each.
  void bind_tables(PageTableBuilder& sinks, PageTableBuilder& history,
                   PageTableBuilder& recent) const;
  // Demotions commit(n_staged) will make: recent pages (oldest first) and the reserved history
  // pages they go to; appended to src / dst.
  int64_t n_pending_demotions() const;
  void pending_demotions(std::vector<PageId>* src, std::vector<PageId>* dst) const;
  // commit() after the caller has run kernels::demote_pages on pending_demotions(): bookkeeping
  // only.
  void commit_demoted(int64_t n);
  // Parameter blocks with this cache's layout, codec, transforms and pool bases filled in.
  kernels::KvAppendParams append_params(int layer) const;
  kernels::DecodeAttnParams decode_params(int layer, int n_heads_q) const;
  kernels::PrefillAttnParams prefill_params(int layer, int n_heads_q, AttendMode mode) const;
  kernels::DemotePagesParams demote_params() const;

  // --- One sequence alone (host caches: the CPU kernels run here) -----------------------------
  // Stores the staged tokens' K and V of one layer. k, v: [n, n_heads_kv, head_dim] float,
  // K after k_norm and RoPE (centred and rotated here when the mode has a key transform).
  void write(int layer, const float* k, const float* v, int64_t n);
  // Attention of the staged tokens' queries. q: [n, n_heads_q, head_dim] (unrotated);
  // out: [n, n_heads_q, head_dim] in the (rotated) value space.
  Status attend(int layer, const float* q, int n_heads_q, int64_t n, float* out, AttendMode mode,
                AttendScratch& scratch) const;
  // Makes n staged tokens part of the sequence and demotes full recent pages to history pages.
  // Internal (the staged tokens stay staged; the owner drops the cache) when a page to
  // demote holds a value the history format cannot store (non-finite K/V).
  Status commit(int64_t n);
  // Drops everything (pages back to the pools).
  void clear();

  CacheBytes bytes() const;

  // Prefix sharing (kv/radix_cache.h). Every full page is shared (none is written again): sink
  // pages, INT2 history pages and full recent pages. Pool index 0 = exact pool, 1 = INT2 pool.
  // A shared recent page is only read: demotion writes the sequence's own new history page and
  // drops the reference to the exact page (commit_demoted), which the other holders keep.
  int64_t shareable_tokens() const;
  std::vector<CachedPage> shareable_pages() const;  // [shareable_tokens() / page_size]
  // On an empty cache: take over a shared prefix of whole pages in the form this cache holds:
  // exact sinks, then (quantized modes) history pages, then exact recent pages (kv/admission.h
  // choose_prefix_forms). The history may end before or after history_end(n): the next commit
  // demotes what lags, and the recent window is never shorter once the history catches up. The
  // caller has retained one reference per page for this cache (released by clear() / the
  // destructor like any other page). InvalidArgument when the pools are not in that order.
  // Hybrid (a state pool attached): a non-empty prefix needs state_snapshot, the StatePool slot
  // holding the DeltaNet state after exactly those pages' tokens, which is copied into this
  // cache's slot (taken now); InvalidArgument without one, ResourceExhausted when no slot can be
  // taken (nothing adopted either way).
  Status adopt_prefix(std::span<const CachedPage> pages, int32_t state_snapshot = -1);

  // Hybrid only: copies the state after the committed tokens (none staged) into this cache's
  // snapshot slot (taken at the first call, given back in clear()), replacing the previous one.
  // ResourceExhausted when no slot can be taken.
  Status keep_state_snapshot();
  int32_t state_snapshot_slot() const { return snapshot_slot_; }      // -1 = none
  int64_t state_snapshot_tokens() const { return snapshot_tokens_; }  // the state's position

  // Reads a token's K or V (kv 0 = K, 1 = V) of one head as attention sees it: exact rows as
  // stored (rotated K), history rows dequantized. For tests and evaluation.
  void read_row(int layer, int kv, int head, int64_t pos, float* out) const;

 private:
  bool kivi() const { return spec_->mode == quant::CacheMode::kKivi2; }

  const KvCacheSpec* spec_;
  kernels::KvPageLayout layout_;
  PagePool* exact_pool_;
  PagePool* int2_pool_;
  int64_t n_tokens_ = 0;
  int64_t hist_end_ = 0;
  int64_t n_staged_ = 0;
  std::vector<PageId> sink_pages_;    // exact pool, tokens [0, n_sink)
  std::vector<PageId> hist_pages_;    // int2 pool, tokens [n_sink, hist_end)
  std::vector<PageId> recent_pages_;  // exact pool, tokens [hist_end, ...)
  std::vector<PageId> int2_reserved_; // int2 pages held for the next commit's demotions
  int64_t staged_sink_pages_ = 0;     // pages reserve() appended, for unreserve()
  int64_t staged_recent_pages_ = 0;
  StatePool* state_pool_ = nullptr;
  int32_t state_slot_ = -1;
  int32_t snapshot_slot_ = -1;   // keep_state_snapshot()'s copy, -1 = none
  int64_t snapshot_tokens_ = 0;  // tokens that state has seen
};

}  // namespace oscar::kv
