// Devices and the memory they own. DeviceBuffer is move-only bytes on one device, freed by the
// backend that allocated them; copies between devices are explicit backend calls
// (kernels/backend.h), never implicit. Plain host code: no CUDA headers here.
#pragma once

#include <cstddef>
#include <functional>
#include <utility>

namespace oscar {

enum class Device { kCpu = 0, kCuda = 1 };

inline const char* device_name(Device d) { return d == Device::kCpu ? "cpu" : "cuda"; }

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(void* data, size_t bytes, Device device, std::function<void(void*)> free)
      : data_(data), bytes_(bytes), device_(device), free_(std::move(free)) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      device_ = o.device_;
      free_ = std::move(o.free_);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  bool empty() const { return data_ == nullptr; }
  void reset() {
    if (data_ != nullptr && free_) free_(data_);
    data_ = nullptr;
    bytes_ = 0;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_ = Device::kCpu;
  std::function<void(void*)> free_;
};

}  // namespace oscar
