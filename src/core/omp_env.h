// OpenMP's wait policy, which must be chosen before libgomp loads.
#pragma once

namespace oscar {

// libgomp reads its wait policy once, when it loads. How long an idle thread spins before it
// sleeps decides two cases, measured on the 2-core development VM (tiny-qwen3, batch-1 decode at
// 512 tokens, docs/results/model_cpu.md):
//   - alone on the cores, a step opens ~60 short parallel regions; threads that sleep at once
//     (spin 0) pay a futex wake-up per region: 3.7 ms a token, against 2.4 ms with a short spin;
//   - two such processes on the same cores: long spins starve the thread doing the work (libgomp's
//     default of 300000 spins: 564 ms a token, 10000 spins: 45 ms, 300 spins: 5.5 ms, 0: 4.5 ms).
// Call first thing in main(): when neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set, it sets
// PASSIVE with GOMP_SPINCOUNT=300 (spin briefly, then sleep) and re-executes the program once. An
// explicit setting wins; if exec fails the program carries on with libgomp's default.
void set_omp_wait_policy(char** argv);

}  // namespace oscar
