#!/usr/bin/env bash
# Builds every libFuzzer target of tests/fuzz/ (clang, ASan + UBSan, every library compiled with
# -fsanitize=fuzzer-no-link) in ./build-fuzz, then runs each for N seconds.
#   scripts/fuzz.sh [SECONDS=20] [NAME_FILTER]      e.g. scripts/fuzz.sh 60 safetensors
# Seeds: tests/fuzz/corpus/<name>/ (read-only; new inputs go to build-fuzz/corpus/<name>/).
# Dictionary: tests/fuzz/<name>.dict when present. Crashes: build-fuzz/artifacts/<name>/.
# Exits non-zero if any fuzzer fails to build or finds a crash, leak or timeout.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-20}"
filter="${2:-}"
jobs="$(nproc)"

source scripts/lib/need.sh
need cmake cmake
need clang clang
need clang++ clang
# The libraries are built with -fopenmp, and the fuzzers link libFuzzer: with clang these need
# clang's OpenMP (libomp-dev) and its runtime libraries (libclang-rt-dev). Two small probes, so a
# missing one is named here rather than as "Could NOT find OpenMP_C" at configure time.
probe="$(mktemp -d)"
trap 'rm -rf "${probe}"' EXIT
printf '#include <omp.h>\nint main(void) { return omp_get_max_threads() > 0 ? 0 : 1; }\n' >"${probe}/omp.c"
clang -fopenmp "${probe}/omp.c" -o "${probe}/omp" 2>"${probe}/omp.log" || {
  echo "fuzz.sh: clang cannot build with -fopenmp: install the Debian package libomp-dev (bash scripts/setup.sh installs every dependency); clang said: $(head -n 1 "${probe}/omp.log")" >&2
  exit 1
}
printf 'int LLVMFuzzerTestOneInput(const unsigned char* d, unsigned long n) { return 0; }\n' >"${probe}/fuzz.c"
clang -fsanitize=fuzzer,address,undefined "${probe}/fuzz.c" -o "${probe}/fuzz" 2>"${probe}/fuzz.log" || {
  echo "fuzz.sh: clang cannot link -fsanitize=fuzzer,address,undefined: install the Debian package libclang-rt-dev (bash scripts/setup.sh installs every dependency); clang said: $(head -n 1 "${probe}/fuzz.log")" >&2
  exit 1
}

sanitize="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
CC=clang CXX=clang++ cmake -S . -B build-fuzz "${gen[@]}" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DOSCAR_BUILD_FUZZERS=ON -DOSCAR_BUILD_TESTS=OFF \
  "-DCMAKE_C_FLAGS=${sanitize}" "-DCMAKE_CXX_FLAGS=${sanitize}" >/dev/null

# Every fuzz_* target the build defines (one oscar_add_fuzzer line each in tests/fuzz/).
mapfile -t fuzzers < <(cmake --build build-fuzz --target help |
                       sed -n 's/^\(fuzz_[A-Za-z0-9_]*\):.*/\1/p' | sort -u |
                       grep -e "${filter}" || true)
if [ "${#fuzzers[@]}" -eq 0 ]; then
  echo "fuzz.sh: no fuzz_* targets${filter:+ matching '${filter}'}" >&2
  exit 1
fi
echo "fuzz.sh: building ${fuzzers[*]}"
cmake --build build-fuzz --target "${fuzzers[@]}" -j "${jobs}"

failed=()
for name in "${fuzzers[@]}"; do
  bin="$(find build-fuzz -type f -name "${name}" -perm -u+x | head -n 1)"
  if [ -z "${bin}" ]; then
    echo "fuzz.sh: ${name}: binary not found" >&2
    failed+=("${name}(missing)")
    continue
  fi
  work="build-fuzz/corpus/${name}"
  artifacts="build-fuzz/artifacts/${name}"
  mkdir -p "${work}" "${artifacts}"
  args=(-max_total_time="${secs}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="${artifacts}/" "${work}")
  [ -d "tests/fuzz/corpus/${name}" ] && args+=("tests/fuzz/corpus/${name}")
  [ -f "tests/fuzz/${name}.dict" ] && args=(-dict="tests/fuzz/${name}.dict" "${args[@]}")
  echo "fuzz.sh: running ${name} for ${secs}s"
  log="build-fuzz/${name}.log"
  if "${bin}" "${args[@]}" >"${log}" 2>&1; then
    echo "fuzz.sh: ${name}: ok ($(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "${log}" |
                                  grep -o '[0-9]*$') runs)"
  else
    echo "fuzz.sh: ${name}: FAILED, see ${log}; reproducer in ${artifacts}/" >&2
    tail -n 40 "${log}" >&2
    failed+=("${name}")
  fi
done

if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz.sh: failures: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: all ${#fuzzers[@]} fuzzers ran ${secs}s without a crash"
