// OSCAR_HD marks functions that CPU and CUDA code share (the layout headers: quant/int2_layout.h,
// quant/bit_plan_layout.h, kernels/kv_layout.h, kernels/page_table.h): __host__ __device__ under
// nvcc, nothing otherwise.
#pragma once

#if defined(__CUDACC__)
#define OSCAR_HD __host__ __device__
#else
#define OSCAR_HD
#endif
