#include "kv/step_plan.h"

#include "core/check.h"

namespace oscar::kv {

StepPlan StepPlan::make(std::span<const StepChunk> chunks, AttendMode mode) {
  StepPlan p;
  p.mode = mode;
  OSCAR_CHECK(!chunks.empty(), "a step plan needs at least one chunk");
  const SequenceCache& first = *chunks[0].cache;
  const int32_t P = first.spec().regions.page_size;
  p.ops = kv_op_params(first.spec(), *first.exact_pool(), first.int2_pool(), mode);
  p.state_pool = first.state_pool();
  for (PageTableBuilder* b : {&p.dec_sinks, &p.dec_hist, &p.dec_recent, &p.pre_sinks, &p.pre_hist,
                              &p.pre_recent})
    *b = PageTableBuilder(P);
  auto is_decode = [](const StepChunk& c) {
    return c.tokens.size() == 1 && c.cache->spec().mode != quant::CacheMode::kKivi2;
  };
  for (int pass = 0; pass < 2; ++pass)
    for (size_t i = 0; i < chunks.size(); ++i)
      if (is_decode(chunks[i]) == (pass == 0)) p.chunk.push_back(static_cast<int32_t>(i));
  p.cu_seqlens.push_back(0);
  p.cu_logits.push_back(0);
  for (int32_t s = 0; s < p.n_seqs(); ++s) {
    const StepChunk& c = chunks[p.chunk[s]];
    SequenceCache& cache = *c.cache;
    const int64_t n = static_cast<int64_t>(c.tokens.size());
    OSCAR_CHECK(n > 0 && cache.n_staged() == n, "chunk %d: %lld tokens, %lld staged", p.chunk[s],
                static_cast<long long>(n), static_cast<long long>(cache.n_staged()));
    OSCAR_CHECK(&cache.spec() == &first.spec() && cache.exact_pool() == first.exact_pool() &&
                    cache.int2_pool() == first.int2_pool(),
                "chunk %d: its cache has another spec or other pools than chunk %d's", p.chunk[s],
                p.chunk[0]);
    const bool decode = is_decode(c);
    if (decode) p.n_decode += 1;
    p.caches.push_back(&cache);
    // A cache of another state pool has no slot in this one (the hybrid model refuses it).
    p.state_slots.push_back(cache.state_pool() == p.state_pool ? cache.state_slot() : -1);
    p.pos0.push_back(cache.n_tokens());
    const int32_t row0 = p.n_rows();
    for (int64_t i = 0; i < n; ++i) {
      p.token_ids.push_back(c.tokens[i]);
      p.positions.push_back(static_cast<int32_t>(cache.n_tokens() + i));
      p.write_slots.push_back(cache.exact_slot(cache.n_tokens() + i));
    }
    p.cu_seqlens.push_back(p.n_rows());
    for (int64_t i = c.all_logits ? 0 : n - 1; i < n; ++i)
      p.logit_rows.push_back(row0 + static_cast<int32_t>(i));
    p.cu_logits.push_back(p.n_logit_rows());
    if (decode) {
      cache.bind_tables(p.dec_sinks, p.dec_hist, p.dec_recent);
    } else {
      cache.bind_tables(p.pre_sinks, p.pre_hist, p.pre_recent);
    }
    cache.pending_demotions(&p.demote_src, &p.demote_dst);
    p.demote_seq.resize(p.demote_src.size(), s);
  }
  p.pre_hist_distinct = kernels::distinct_pages(p.pre_hist.page_ids());
  return p;
}

void StepPlan::commit(std::span<const int32_t> demote_status, std::vector<Status>* per_chunk) const {
  OSCAR_CHECK(demote_status.size() == demote_src.size(), "%zu demotion statuses for %zu pages",
              demote_status.size(), demote_src.size());
  std::vector<bool> failed(static_cast<size_t>(n_seqs()), false);
  for (size_t i = 0; i < demote_status.size(); ++i)
    if (demote_status[i] != 0) failed[demote_seq[i]] = true;
  size_t n_chunks = 0;
  for (int32_t c : chunk) n_chunks = std::max(n_chunks, static_cast<size_t>(c) + 1);
  if (per_chunk->size() < n_chunks) per_chunk->resize(n_chunks);
  for (int32_t s = 0; s < n_seqs(); ++s) {
    if (failed[s]) {
      (*per_chunk)[chunk[s]] = internal_error(
          "kv cache: a K/V value of this request is non-finite or beyond fp16 and cannot be "
          "stored in the history (positions %lld-%lld)", static_cast<long long>(pos0[s]),
          static_cast<long long>(pos0[s] + cu_seqlens[s + 1] - cu_seqlens[s] - 1));
      continue;
    }
    caches[s]->commit_demoted(cu_seqlens[s + 1] - cu_seqlens[s]);
  }
}

}  // namespace oscar::kv
