// Stager: the step plan's arrays where the ops read them. The plan's own vectors for the CPU
// backend; for a device backend, one host staging buffer uploaded in one copy (a few KiB per
// step), with room reserved where a recorded graph needs fixed offsets. Used by the step runner
// (model/step_runner.h) only; not thread-safe.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "core/device.h"
#include "core/status.h"
#include "kernels/backend.h"
#include "kernels/page_table.h"

namespace oscar::model {

class Stager {
 public:
  Stager(kernels::Backend& be, std::vector<uint8_t>* staging, DeviceBuffer* dev)
      : be_(be), staging_(staging), dev_(dev), host_(be.device() == Device::kCpu) {
    staging_->clear();
  }
  // Records n elements at p, in room for cap >= n of them (a fixed layout for graph replays);
  // returns a handle to resolve after upload().
  template <typename T>
  size_t add(const T* p, size_t n, size_t cap = 0) {
    const size_t off = (staging_->size() + 15) / 16 * 16;
    srcs_.push_back(p);
    if (!host_) {
      staging_->resize(off + std::max(n, cap) * sizeof(T));
      if (n > 0) std::memcpy(staging_->data() + off, p, n * sizeof(T));
    }
    offsets_.push_back(off);
    return srcs_.size() - 1;
  }
  size_t add_table(const kernels::PageTableView& t, size_t page_cap = 0) {
    const size_t h = add(t.indptr, static_cast<size_t>(t.n_seqs) + 1);
    add(t.page_ids, t.indptr == nullptr ? 0 : static_cast<size_t>(t.indptr[t.n_seqs]), page_cap);
    add(t.last_page_len, static_cast<size_t>(t.n_seqs));
    return h;
  }
  // True when upload() had to move the device copy (a replayed graph's pointers are stale).
  bool moved() const { return moved_; }
  Status upload() {
    if (host_ || staging_->empty()) return Status();
    if (dev_->bytes() < staging_->size()) {
      moved_ = true;
      dev_->reset();
      OSCAR_ASSIGN_OR_RETURN(*dev_,
                             be_.alloc(std::max<size_t>(staging_->size() * 2, 4096), "step plan"));
    }
    return be_.upload(staging_->data(), staging_->size(), dev_->data());
  }
  template <typename T>
  const T* get(size_t h) const {
    if (host_) return static_cast<const T*>(srcs_[h]);
    return reinterpret_cast<const T*>(dev_->as<uint8_t>() + offsets_[h]);
  }
  kernels::PageTableView table(size_t h, int32_t n_seqs) const {
    kernels::PageTableView t;
    t.indptr = get<int32_t>(h);
    t.page_ids = get<int32_t>(h + 1);
    t.last_page_len = get<int32_t>(h + 2);
    t.n_seqs = n_seqs;
    return t;
  }

 private:
  kernels::Backend& be_;
  std::vector<uint8_t>* staging_;
  DeviceBuffer* dev_;
  bool host_;
  bool moved_ = false;
  std::vector<const void*> srcs_;
  std::vector<size_t> offsets_;
};

}  // namespace oscar::model
