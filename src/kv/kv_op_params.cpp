#include "kv/kv_op_params.h"

#include <cmath>

namespace oscar::kv {

KvOpParams kv_op_params(const KvCacheSpec& spec, PagePool& exact_pool, PagePool* hist_pool,
                        AttendMode mode) {
  uint8_t* exact = exact_pool.base();
  uint8_t* hist = hist_pool != nullptr ? hist_pool->base() : nullptr;
  const float scale = 1.0f / std::sqrt(static_cast<float>(spec.head_dim));
  KvOpParams p;
  p.append.layout = spec.op_layout();
  p.append.exact_pool = exact;
  p.append.k_mean = spec.op_k_mean();
  p.append.k_rotation = spec.op_k_rotation();
  p.rotate_queries.q_rotation = spec.op_query_rotations();

  p.decode.group_size = spec.group_size;
  p.decode.quantizer = spec.mode == quant::CacheMode::kOscarLloyd
                           ? quant::HistQuantizer::kInt2Lloyd
                           : quant::HistQuantizer::kInt2Uniform;
  p.decode.scale = scale;
  p.decode.layout = spec.op_layout();
  p.decode.exact_pool = exact;
  p.decode.hist_pool = hist;

  p.prefill.scale = scale;
  p.prefill.layout = spec.op_layout();
  p.prefill.codec = spec.op_codec();
  p.prefill.n_sink = spec.regions.n_sink;
  p.prefill.n_recent = spec.regions.n_recent;
  p.prefill.quantized = spec.quantized();
  p.prefill.decode_equivalent = mode == AttendMode::kDecodeEquivalent;
  p.prefill.exact_pool = exact;
  p.prefill.hist_pool = hist;

  p.demote.layout = spec.op_layout();
  p.demote.codec = spec.op_codec();
  p.demote.exact_pool = exact;
  p.demote.hist_pool = hist;
  return p;
}

}  // namespace oscar::kv
