// The CUDA backend's constructor (kernels/cuda/backend_cuda.cpp), for make_backend() only: the
// one place on the host side that knows a CUDA build exists. Plain C++.
#pragma once

#include <cstddef>
#include <memory>

#include "core/status.h"

namespace oscar::kernels {

class Backend;

// NotFound when no GPU is visible. One stream per backend; device 0 (CUDA_VISIBLE_DEVICES picks).
Result<std::unique_ptr<Backend>> make_cuda_backend();

}  // namespace oscar::kernels
