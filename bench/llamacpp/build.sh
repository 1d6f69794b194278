#!/usr/bin/env bash
# Builds llama.cpp from a snapshot of its git repository, CPU backend only, out of tree: nothing of
# llama.cpp enters this repository. The tag is release b10573 (commit d775b896), the build issue
# #28 compared against; the snapshot is ngxson/llama.cpp, a fork that holds the tag (the main
# repository's snapshot is too large to bring here).
#
#   LLAMACPP_GIT=/path/to/llama.cpp.git LLAMACPP_DIR=/tmp/llamacpp bash bench/llamacpp/build.sh
#
# LLAMACPP_GIT: a git directory holding the tag (default: the fetch tool's mirror of the fork).
# LLAMACPP_DIR: where the sources and the build go (default /tmp/llamacpp-b10573).
# Flags: -DGGML_NATIVE=ON -DGGML_OPENMP=ON, Release; targets llama-bench (decode speed at a
# context depth) and llama-simple (a greedy continuation, to check the converted model).
set -euo pipefail
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi
tag=b10573
git_dir=${LLAMACPP_GIT:-/work/.mirror/ngxson+llama.cpp/repo}
dir=${LLAMACPP_DIR:-/tmp/llamacpp-$tag}
jobs=${JOBS:-2}

commit=$(git -C "$git_dir" rev-parse "$tag^{commit}")
if [ ! -f "$dir/src/CMakeLists.txt" ] || [ "$(cat "$dir/COMMIT" 2>/dev/null)" != "$commit" ]; then
  rm -rf "$dir/src"
  mkdir -p "$dir/src"
  # The snapshot lacks the vocabulary test models (large blobs; git reports them as invalid
  # objects and goes on); the build does not read them.
  git -C "$git_dir" archive "$commit" -- . ':(exclude)models/ggml-vocab-*.gguf' |
    tar -x -C "$dir/src"
  echo "$commit" > "$dir/COMMIT"
fi
launcher=()
command -v ccache >/dev/null &&
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$dir/src" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=ON -DGGML_OPENMP=ON -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_NUMBER="${tag#b}" -DLLAMA_BUILD_COMMIT="${commit:0:8}" \
  "${launcher[@]}" >/dev/null
cmake --build "$dir/build" -j "$jobs" --target llama-bench llama-simple
echo "llama.cpp $tag ($commit) built in $dir/build/bin"
