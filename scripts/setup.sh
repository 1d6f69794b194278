#!/usr/bin/env bash
# Installs every dependency of oscar's build, tests, fuzzers and README examples from Debian 12
# packages (the npm package the HTTP conformance test uses is installed by that test's run.sh).
# Idempotent: safe to run twice; skips apt when everything is present.
# Checked on a minimal Debian 12 (debootstrap --variant=minbase) by scripts/fresh-machine-check.sh.
set -euo pipefail

packages=(
  build-essential cmake pkg-config ninja-build          # the build (scripts/build.sh)
  libeigen3-dev libpcre2-dev libutf8proc-dev nlohmann-json3-dev
  libcli11-dev libfmt-dev libboost-dev libboost-system-dev
  libgtest-dev libgmock-dev libbenchmark-dev            # tests and benchmarks
  clang libclang-rt-dev libomp-dev                      # fuzzers (scripts/fuzz.sh): clang, libFuzzer, clang's OpenMP
  curl ca-certificates                                  # the e2e test polls /health with curl; the README's examples; npm over HTTPS
  python3                                               # tests/e2e (free port), scripts/make_niah.py, tests/fuzz/make_seed_corpus.py
  python3-prometheus-client                             # tests/e2e/metrics: /metrics through the Prometheus project's parser
  git                                                   # oscar eval records the commit it ran at
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev          # KV-cache events (ZMQ + msgpack)
)

if ! command -v apt-get >/dev/null || ! command -v dpkg-query >/dev/null; then
  echo "setup.sh: apt-get/dpkg-query not found: this script installs Debian 12 packages; elsewhere install the equivalents of: ${packages[*]} nodejs npm" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup.sh: not root and 'sudo' not found: run as root or install the Debian package sudo" >&2; exit 1; }
  SUDO="sudo"
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm run the OpenAI-client conformance test (tests/e2e): any node >= 18 on PATH will
# do (Debian's is 18); otherwise Debian's nodejs and npm.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  missing+=(nodejs npm)
fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all Debian packages present"
fi
