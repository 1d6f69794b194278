#include <immintrin.h>
#include <chrono>
#include <cstdio>
int main() {
  const long n = 20000000;
  auto t = std::chrono::steady_clock::now();
  for (long i = 0; i < n; ++i) _mm_pause();
  double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t).count() / n;
  std::printf("pause: %.1f ns; 300 spins: %.1f us\n", ns, 300 * ns / 1000);
}
