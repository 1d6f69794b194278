#include "core/omp_env.h"

#include <unistd.h>

#include <cstdlib>

namespace oscar {

void ensure_passive_omp_wait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  execv("/proc/self/exe", argv);  // returns only on failure
}

}  // namespace oscar
