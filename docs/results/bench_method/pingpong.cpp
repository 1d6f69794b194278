// Round trip of two futex wake-ups between a thread on vCPU 0 and one on vCPU N (argument, default
// 1); each side sleeps in FUTEX_WAIT, as libgomp's passive wait does, so a round trip is two
// wake-ups of a sleeping thread. g++ -O2 -std=c++20 -pthread pingpong.cpp -o pingpong
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>
std::atomic<int> turn{0};
void wait_for(int v) {  // sleeps in FUTEX_WAIT until turn == v
  for (int cur; (cur = turn.load()) != v;)
    syscall(SYS_futex, &turn, FUTEX_WAIT_PRIVATE, cur, nullptr, nullptr, 0);
}
void pass(int v) { turn.store(v); syscall(SYS_futex, &turn, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0); }
void pin(int c) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(c, &s); pthread_setaffinity_np(pthread_self(), sizeof s, &s); }
int main(int argc, char** argv) {
  const int n = 2000, other = argc > 1 ? atoi(argv[1]) : 1;
  std::thread t([&] { pin(other); for (int i = 0; i < n; ++i) { wait_for(1); pass(0); } });
  pin(0);
  std::vector<double> us;
  for (int i = 0; i < n; ++i) {
    usleep(20);  // let the other side fall asleep (and its vCPU halt, if idle)
    auto t0 = std::chrono::steady_clock::now();
    pass(1); wait_for(0);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  t.join();
  std::sort(us.begin(), us.end());
  std::printf("pingpong cpu0<->cpu%d round trip us: median %.1f p10 %.1f p90 %.1f\n", other, us[n/2], us[n/10], us[n*9/10]);
}
