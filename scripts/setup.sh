#!/usr/bin/env bash
# Installs every build and test dependency of oscar from Debian packages (and the npm packages the
# HTTP conformance test uses). Idempotent: safe to run twice; skips apt when everything is present.
set -euo pipefail

packages=(
  build-essential cmake pkg-config ninja-build
  libeigen3-dev libpcre2-dev libutf8proc-dev nlohmann-json3-dev
  libcli11-dev libfmt-dev libboost-dev libboost-system-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-dev
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev
)

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all Debian packages present"
fi

# Node.js runs the OpenAI-client conformance test (tests/e2e); the npm package itself is installed
# by that test's run.sh into its own folder.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "setup: installing nodejs npm"
  ${SUDO:-} apt-get update -qq
  DEBIAN_FRONTEND=noninteractive ${SUDO:-} apt-get install -y -qq --no-install-recommends nodejs npm
fi
