// StatePool: the fixed-size per-sequence state of the hybrid models' Gated DeltaNet layers
// (Qwen3.5: three of every four layers), beside the KV pages of the full-attention layers. One
// slot per live sequence holds, for every DeltaNet layer, the conv's last K-1 inputs and the delta
// rule's [heads_v, d_k, d_v] matrix (kernels/gated_delta.h), in the layouts the ops read:
//   conv(layer) [n_slots, K-1, conv_dim], recurrent(layer) [n_slots, heads_v, d_k, d_v] float32.
// A SequenceCache takes a slot at its first reserve() and gives it back in clear(); a slot is
// zeroed when taken (a fresh sequence starts from zero state).
//
// Host memory, grown on demand by whole slots (each layer's array keeps its slot stride, so slot
// ids stay valid; pointers do not: read them once per step). The prefix cache's state snapshots
// (kv/radix_cache.h, hybrid mode) are slots of the same pool, filled by copy_slot(); the
// device version (a fixed pool in the backend's memory, sized at start-up like the page pools)
// is not here. Not thread-safe: owned by the engine's step loop.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace oscar::kv {

class StatePool {
 public:
  // n_layers DeltaNet layers, each with conv_floats + recurrent_floats floats per slot.
  StatePool(int32_t n_layers, int64_t conv_floats, int64_t recurrent_floats);

  // A zeroed slot; ResourceExhausted when the host cannot hold one more.
  Result<int32_t> acquire();
  void release(int32_t slot);
  // Copies slot src's state (every layer's conv and recurrent arrays) into slot dst: a state
  // snapshot, or a snapshot back into a sequence's slot. Both must be taken (acquired).
  void copy_slot(int32_t dst, int32_t src);

  int32_t n_layers() const { return n_layers_; }
  int32_t n_slots() const { return n_slots_; }  // slots allocated (live or free)
  int32_t n_live() const { return n_slots_ - static_cast<int32_t>(free_.size()); }
  int64_t bytes_per_slot() const;
  // Layer `layer`'s arrays over all slots (pointers valid until the next acquire()).
  float* conv(int32_t layer) { return conv_[layer].data(); }
  float* recurrent(int32_t layer) { return rec_[layer].data(); }

 private:
  int32_t n_layers_;
  int64_t conv_floats_, rec_floats_;
  int32_t n_slots_ = 0;
  std::vector<int32_t> free_;
  std::vector<std::vector<float>> conv_, rec_;  // [n_layers][n_slots · floats]
};

}  // namespace oscar::kv
