#include "core/omp_env.h"

#include <unistd.h>

#include <cstdlib>

namespace oscar {

void set_omp_wait_policy(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  setenv("GOMP_SPINCOUNT", "300", 1);  // read by libgomp before the policy's own spin count
  execv("/proc/self/exe", argv);  // returns only on failure
}

}  // namespace oscar
