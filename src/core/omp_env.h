// OpenMP's wait policy, which must be chosen before libgomp loads.
#pragma once

namespace oscar {

// libgomp reads OMP_WAIT_POLICY once, when it loads. Its default lets idle threads spin, which
// starves the thread doing the work whenever the cores are shared: measured on a busy 2-core VM,
// decode ran at 2 tokens/s instead of 400. Call first thing in main(): when OMP_WAIT_POLICY is
// unset it sets PASSIVE and re-executes the program once (an explicit setting wins; if exec fails
// the program carries on with the default).
void ensure_passive_omp_wait(char** argv);

}  // namespace oscar
