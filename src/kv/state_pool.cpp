#include "kv/state_pool.h"

#include <algorithm>
#include <new>

#include "core/check.h"

namespace oscar::kv {

StatePool::StatePool(int32_t n_layers, int64_t conv_floats, int64_t recurrent_floats)
    : n_layers_(n_layers), conv_floats_(conv_floats), rec_floats_(recurrent_floats) {
  OSCAR_CHECK(n_layers > 0 && conv_floats >= 0 && recurrent_floats > 0,
              "StatePool: %d layers, %lld conv / %lld recurrent floats", n_layers,
              static_cast<long long>(conv_floats), static_cast<long long>(recurrent_floats));
  conv_.resize(static_cast<size_t>(n_layers));
  rec_.resize(static_cast<size_t>(n_layers));
}

int64_t StatePool::bytes_per_slot() const {
  return int64_t{n_layers_} * (conv_floats_ + rec_floats_) * static_cast<int64_t>(sizeof(float));
}

Result<int32_t> StatePool::acquire() {
  if (free_.empty()) {
    const int32_t grown = std::max<int32_t>(4, 2 * n_slots_);
    try {
      for (int32_t l = 0; l < n_layers_; ++l) {
        conv_[l].resize(static_cast<size_t>(grown * conv_floats_));
        rec_[l].resize(static_cast<size_t>(grown * rec_floats_));
      }
    } catch (const std::bad_alloc&) {
      return resource_exhausted("DeltaNet state pool: no memory for %d slots of %lld bytes",
                                grown, static_cast<long long>(bytes_per_slot()));
    }
    for (int32_t s = grown - 1; s >= n_slots_; --s) free_.push_back(s);
    n_slots_ = grown;
  }
  const int32_t slot = free_.back();
  free_.pop_back();
  for (int32_t l = 0; l < n_layers_; ++l) {
    std::fill_n(conv_[l].begin() + slot * conv_floats_, conv_floats_, 0.0f);
    std::fill_n(rec_[l].begin() + slot * rec_floats_, rec_floats_, 0.0f);
  }
  return slot;
}

void StatePool::release(int32_t slot) {
  OSCAR_CHECK(slot >= 0 && slot < n_slots_, "StatePool::release: slot %d of %d", slot, n_slots_);
  free_.push_back(slot);
}

void StatePool::copy_slot(int32_t dst, int32_t src) {
  OSCAR_CHECK(dst >= 0 && dst < n_slots_ && src >= 0 && src < n_slots_,
              "StatePool::copy_slot: slots %d <- %d of %d", dst, src, n_slots_);
  if (dst == src) return;
  for (int32_t l = 0; l < n_layers_; ++l) {
    std::copy_n(conv_[l].begin() + src * conv_floats_, conv_floats_,
                conv_[l].begin() + dst * conv_floats_);
    std::copy_n(rec_[l].begin() + src * rec_floats_, rec_floats_,
                rec_[l].begin() + dst * rec_floats_);
  }
}

}  // namespace oscar::kv
