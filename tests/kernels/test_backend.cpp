// make_backend: "cpu" gives a backend whose memory is usable; "cuda" in a CPU build, or an unknown
// name, is refused with a message that says why and what to pass instead.
#include "kernels/backend.h"

#include <gtest/gtest.h>

namespace oscar::kernels {
namespace {

TEST(Backend, MakeBackendNamesWhatItRefuses) {
  auto cpu = make_backend("cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  EXPECT_EQ(cpu.value()->device(), Device::kCpu);
  auto buf = cpu.value()->alloc(1000, "test");
  ASSERT_TRUE(buf.ok());
  EXPECT_EQ(buf.value().bytes(), 1000u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buf.value().data()) % 64, 0u);
#ifndef OSCAR_HAS_CUDA
  const Status cuda = make_backend("cuda").status();
  EXPECT_EQ(cuda.code(), StatusCode::kUnimplemented);
  EXPECT_NE(cuda.to_string().find("OSCAR_CUDA=ON"), std::string::npos) << cuda.to_string();
#endif
  // auto: cuda when usable, else the CPU (always in a CPU build).
  auto any = make_backend("auto");
  ASSERT_TRUE(any.ok()) << any.status().to_string();
#ifndef OSCAR_HAS_CUDA
  EXPECT_EQ(any.value()->device(), Device::kCpu);
#endif
  const Status bad = make_backend("tpu").status();
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.to_string().find("unknown device 'tpu'"), std::string::npos) << bad.to_string();
}

}  // namespace
}  // namespace oscar::kernels
