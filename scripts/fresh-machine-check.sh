#!/usr/bin/env bash
# The fresh-machine check: does what a new user does on a minimal Debian 12, from scratch.
#   1. debootstrap --variant=minbase bookworm into a temporary folder, adding only git and
#      ca-certificates (apt sources: bookworm, bookworm-updates, bookworm-security);
#   2. git clone this checkout's committed HEAD into it (/root/oscar; uncommitted changes are not
#      part of the check);
#   3. inside a chroot (own mount and PID namespaces, with proc, sys and a private /dev):
#      main   the README's first command, `bash scripts/setup.sh && bash scripts/build.sh && ./build/apps/oscar serve`
#             (on a free port instead of 8000), then the README's curl examples and its `oscar run`
#      tests  the README's test command, `bash scripts/setup.sh && bash scripts/test.sh`
#      ci     `bash .ci/run` (CI=true, no standard input), in the same clone after the two above
#      cuda   `cmake -DOSCAR_CUDA=ON` configure and build, where nvcc is on PATH inside the chroot
#             and the repository has CUDA sources (src/kernels/cuda/CMakeLists.txt); otherwise
#             reported as skipped, with the reason
#   4. prints each step's time and result and a summary; unmounts and removes everything it made
#      (also on failure or Ctrl-C). Exits 0 when main, tests and ci pass (cuda passed or skipped).
#
#   bash scripts/fresh-machine-check.sh > fresh.log 2>&1      (root; 20-40 min on 2 cores; not CI)
#
# Run it before resolving an issue that changes dependencies, and record the result in
# docs/results/fresh_machine.md. The host needs root, debootstrap, util-linux (unshare), git, the
# Debian mirror, the npm registry and ~15 GB free; nothing is installed on or removed from the host.
# The host's network site settings are carried into the chroot, as a fresh machine on the same
# network has them: its DNS (resolv.conf), the local CA certificates in
# /usr/local/share/ca-certificates/ (a TLS-intercepting egress proxy's CA; installed with
# update-ca-certificates before the steps) and the *_proxy / CA-bundle environment variables
# (NODE_EXTRA_CA_CERTS, SSL_CERT_FILE, SSL_CERT_DIR, REQUESTS_CA_BUNDLE) that are set.
# Environment (defaults in brackets):
#   FRESH_DIR       where the temporary folder is made [build-fresh-check/ in the repository]
#   FRESH_MIRROR    Debian mirror [http://deb.debian.org/debian]
#   FRESH_SECURITY  security mirror [http://deb.debian.org/debian-security]
#   FRESH_STEPS     steps to run after the clone, comma-separated [main,tests,ci,cuda]
#   FRESH_NICE      niceness of the chroot steps, to share a small machine [10]
#   FRESH_KEEP=1    keep the folder (chroot and logs) for a look; remove it by hand afterwards
#   FRESH_REUSE_ROOT=DIR  copy DIR (an earlier debootstrap result) instead of running debootstrap:
#                   only for testing this script; a real check starts from debootstrap
#   OSCAR_FUZZ_SECONDS  passed to .ci/run [10]
set -uo pipefail
set -m   # each step in a process group of its own: an interrupt ends the whole step, and only it

repo="$(cd "$(dirname "$0")/.." && pwd)"
self="$(basename "$0")"
die() { echo "${self}: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, mount, chroot)"
source "${repo}/scripts/lib/need.sh"
need debootstrap debootstrap
need unshare util-linux
need chroot coreutils
need mount mount
need git git

mirror="${FRESH_MIRROR:-http://deb.debian.org/debian}"
security="${FRESH_SECURITY:-http://deb.debian.org/debian-security}"
steps="${FRESH_STEPS:-main,tests,ci,cuda}"
niceness="${FRESH_NICE:-10}"
commit="$(git -C "${repo}" rev-parse HEAD)" || die "${repo} is not a git checkout"
base="${FRESH_DIR:-${repo}/build-fresh-check}"
mkdir -p "${base}"
free_kb="$(df -Pk "${base}" | awk 'NR == 2 { print $4 }')"
[ "${free_kb}" -ge $(( 15 * 1024 * 1024 )) ] ||
  die "only $(( free_kb / 1024 / 1024 )) GB free under ${base}; the check needs ~15 GB (FRESH_DIR=...)"
work="$(mktemp -d "${base}/run.XXXXXX")"
root="${work}/root"
logs="${work}/logs"
mkdir -p "${root}" "${logs}"

step_pid=""
# Site settings passed into the chroot (only those set on the host).
site_env=()
for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY \
         NODE_EXTRA_CA_CERTS SSL_CERT_FILE SSL_CERT_DIR REQUESTS_CA_BUNDLE; do
  [ -n "${!v:-}" ] && site_env+=("${v}=${!v}")
done
# Processes whose root directory is the chroot: only this script's steps (and what they started).
chroot_pids() {
  local p r
  for p in /proc/[0-9]*; do
    r="$(readlink "${p}/root" 2>/dev/null)" || continue
    [ "${r}" = "${root}" ] && echo "${p#/proc/}"
  done
}
# Mount points at or below the chroot seen from this mount namespace (normally none: the steps
# mount in a namespace of their own, which disappears with them).
mounts_below() {
  awk -v r="${root}" '$5 == r || index($5, r "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r
}
cleanup() {
  local rc=$? p m left
  trap - EXIT INT TERM HUP
  # A step still running (interrupted): its process group, then whatever runs in the chroot.
  [ -n "${step_pid}" ] && kill -TERM -- "-${step_pid}" 2>/dev/null
  for sig in TERM KILL; do
    for p in $(chroot_pids); do kill "-${sig}" "${p}" 2>/dev/null; done
    for _ in 1 2 3 4 5 6 7 8 9 10; do [ -z "$(chroot_pids)" ] && break; sleep 0.5; done
  done
  if [ -n "${step_pid}" ]; then
    # unshare --kill-child: the step's PID namespace, and every process in it, ends with unshare.
    kill -KILL -- "-${step_pid}" 2>/dev/null
    wait "${step_pid}" 2>/dev/null
  fi
  for m in $(mounts_below); do umount "${m}" 2>/dev/null || umount -l "${m}" 2>/dev/null; done
  left="$(mounts_below)"
  if [ -n "${left}" ]; then
    echo "${self}: NOT removing ${work}: still mounted: ${left}" >&2
  elif [ "${FRESH_KEEP:-0}" = 1 ]; then
    echo "${self}: kept ${work} (FRESH_KEEP=1); remove it with: rm -rf --one-file-system ${work}"
  else
    rm -rf --one-file-system "${work}"
    rmdir "${base}" 2>/dev/null
    echo "${self}: removed ${work}"
  fi
  exit "${rc}"
}
trap cleanup EXIT
trap 'echo "${self}: interrupted" >&2; exit 130' INT TERM HUP

# --- step bookkeeping ------------------------------------------------------------------------
results=()
failed=0
now() { date +%s; }
# step NAME COMMAND...: runs COMMAND in the background (so that a signal interrupts the wait),
# output to the terminal and to logs/NAME.log; exit 77 means skipped.
step() {
  local name="$1" t0 rc dt result
  shift
  t0="$(now)"
  echo "=== ${name}: start $(date -u +%H:%M:%S)"
  "$@" > >(tee "${logs}/${name}.log") 2>&1 &
  step_pid=$!
  wait "${step_pid}"
  rc=$?
  step_pid=""
  dt=$(( $(now) - t0 ))
  case "${rc}" in
    0) result=ok ;;
    77) result=skipped ;;
    *) result="FAILED (exit ${rc})"; failed=1 ;;
  esac
  sleep 0.2   # let tee finish
  echo "=== ${name}: ${result} in ${dt} s"
  results+=("${name}|${result}|${dt}")
  return "${rc}"
}

# in_chroot SCRIPT: runs /root/fresh-steps/SCRIPT inside the chroot, in new mount and PID
# namespaces (mounts and processes end with it), with a clean environment like a root login's.
in_chroot() {
  exec nice -n "${niceness}" unshare --mount --propagation private --pid --fork --kill-child \
    /bin/bash -c '
      set -e
      r="$1"; shift
      mount -t proc proc "$r/proc"
      mount -t sysfs sysfs "$r/sys"
      mount -t tmpfs -o mode=0755,nosuid,size=16m dev "$r/dev"
      mknod -m 666 "$r/dev/null" c 1 3;   mknod -m 666 "$r/dev/zero" c 1 5
      mknod -m 666 "$r/dev/full" c 1 7;   mknod -m 666 "$r/dev/random" c 1 8
      mknod -m 666 "$r/dev/urandom" c 1 9; mknod -m 666 "$r/dev/tty" c 5 0
      ln -s /proc/self/fd "$r/dev/fd"; ln -s /proc/self/fd/0 "$r/dev/stdin"
      ln -s /proc/self/fd/1 "$r/dev/stdout"; ln -s /proc/self/fd/2 "$r/dev/stderr"
      mkdir "$r/dev/pts" "$r/dev/shm"
      mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$r/dev/pts"
      ln -s pts/ptmx "$r/dev/ptmx"
      mount -t tmpfs -o mode=1777,nosuid,nodev shm "$r/dev/shm"
      set +e
      chroot "$r" /usr/bin/env -i HOME=/root USER=root LOGNAME=root SHELL=/bin/bash \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin TERM=dumb "$@" </dev/null
    ' _ "${root}" "${site_env[@]}" "$@"
}

# --- 1. debootstrap ----------------------------------------------------------------------------
bootstrap() {
  if [ -n "${FRESH_REUSE_ROOT:-}" ]; then
    echo "debootstrap: NOT run: copying ${FRESH_REUSE_ROOT} (FRESH_REUSE_ROOT, for testing this script)"
    cp -a --one-file-system "${FRESH_REUSE_ROOT}/." "${root}/" || return 1
  else
  # In a mount namespace of its own: the proc and sys it mounts in the target vanish with it.
  unshare --mount --propagation private \
    debootstrap --variant=minbase --include=git,ca-certificates bookworm "${root}" "${mirror}" \
    >"${logs}/debootstrap.out" 2>&1 || { tail -n 30 "${logs}/debootstrap.out"; return 1; }
  fi
  cat >"${root}/etc/apt/sources.list" <<EOF
deb ${mirror} bookworm main
deb ${mirror} bookworm-updates main
deb ${security} bookworm-security main
EOF
  cp /etc/resolv.conf "${root}/etc/resolv.conf"
  printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"${root}/etc/hosts"
  # No package may start a service in the chroot (a real machine would; here it would be the host's).
  printf '#!/bin/sh\nexit 101\n' >"${root}/usr/sbin/policy-rc.d"
  chmod +x "${root}/usr/sbin/policy-rc.d"
  local cas=(/usr/local/share/ca-certificates/*.crt)
  if [ -e "${cas[0]}" ]; then
    mkdir -p "${root}/usr/local/share/ca-certificates"
    cp "${cas[@]}" "${root}/usr/local/share/ca-certificates/"
    echo "site: local CA certificates carried over: ${cas[*]##*/}"
  fi
  echo "site: environment carried over: ${site_env[*]:-none}"
  echo "debootstrap: $(grep -c '^Status: install ok installed' "${root}/var/lib/dpkg/status") packages," \
       "$(du -sm --one-file-system "${root}" | cut -f1) MB"
}

# --- 2. clone ----------------------------------------------------------------------------------
clone() {
  git clone -q --no-hardlinks "${repo}" "${root}/root/oscar" &&
    git -C "${root}/root/oscar" checkout -q --detach "${commit}" &&
    echo "clone: ${commit} ($(git -C "${root}/root/oscar" log -1 --format='%cd' --date=iso-strict))"
}

# --- 3. the step scripts, run inside -------------------------------------------------------------
write_steps() {
  local readme="${root}/root/oscar/README.md" first tests examples oneshot
  first="$(grep -m1 '^bash scripts/setup.sh && bash scripts/build.sh && ' "${readme}")" ||
    { echo "README.md: no line 'bash scripts/setup.sh && bash scripts/build.sh && ...'"; return 1; }
  tests="$(grep -m1 '^bash scripts/setup.sh && bash scripts/test.sh' "${readme}")" ||
    { echo "README.md: no line 'bash scripts/setup.sh && bash scripts/test.sh'"; return 1; }
  # The sh block after "from another terminal": the curl examples (continuation lines joined).
  examples="$(awk '/from another terminal/ { f = 1; next } f && /^```/ { if (++n == 2) exit; next }
                   f && n == 1' "${readme}" | sed -e ':a' -e '/\\$/N; s/\\\n *//; ta')"
  oneshot="$(grep -o '`./build/apps/oscar run [^`]*`' "${readme}" | head -n 1 | tr -d '`')"
  [ -n "${examples}" ] || { echo "README.md: no curl examples after 'from another terminal'"; return 1; }
  local port
  for _ in $(seq 1 50); do
    port=$(( 20000 + RANDOM % 40000 ))
    (exec 3<>"/dev/tcp/127.0.0.1/${port}") 2>/dev/null || break   # refused: free
  done
  mkdir -p "${root}/root/fresh-steps"
  # Shared by the steps: 'timed NAME CMD...' runs CMD with `&&`'s semantics and prints its time.
  cat >"${root}/root/fresh-steps/lib.sh" <<'EOF'
set -uo pipefail
cd /root/oscar
timed() {
  local name="$1" t0 rc
  shift
  t0=$(date +%s)
  echo "--- ${name}: $*"
  eval "$*"
  rc=$?
  echo "--- time: ${name} $(( $(date +%s) - t0 )) s, exit ${rc}"
  return "${rc}"
}
# timed_and 'A && B && C': each part timed on its own, stopping at the first failure, as && would.
timed_and() {
  local line="$1" part
  while [ -n "${line}" ]; do
    part="${line%% && *}"
    [ "${part}" = "${line}" ] && line="" || line="${line#* && }"
    timed "$(echo "${part}" | awk '{ print $NF }' | sed 's,.*/,,')" "${part}" || return
  done
}
EOF
  # main: the README's first command (serve on a free port), its curl examples and `oscar run`.
  local setup_build="${first%% && ./build/apps/oscar serve*}"
  local serve="./build/apps/oscar serve${first#*./build/apps/oscar serve}"
  serve="${serve//--port 8000/--port ${port}}"
  {
    echo 'source /root/fresh-steps/lib.sh'
    printf 'echo "README: %s"\n' "${first//\"/\\\"}"
    printf 'timed_and %q || exit 1\n' "${setup_build}"
    printf 'echo "packages installed: $(dpkg -l | grep -c "^ii")"\n'
    printf 'serve=%q\nport=%q\n' "${serve}" "${port}"
    printf 'examples=%q\noneshot=%q\n' "${examples//localhost:8000/localhost:${port}}" "${oneshot}"
    cat <<'EOF'
echo "--- serve: ${serve}"
t0=$(date +%s)
eval "${serve}" >/tmp/serve.log 2>&1 &
pid=$!
trap 'kill -TERM "${pid}" 2>/dev/null; wait "${pid}" 2>/dev/null' EXIT
until [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${port}/health")" = 200 ]; do
  if ! kill -0 "${pid}" 2>/dev/null || [ $(( $(date +%s) - t0 )) -gt 120 ]; then
    echo "serve: not ready (exited or 120 s); its log:"; cat /tmp/serve.log; exit 1
  fi
  sleep 0.2
done
echo "--- time: serve ready $(( $(date +%s) - t0 )) s"
status=0
n=0
while IFS= read -r cmd; do
  [ -n "${cmd}" ] || continue
  n=$((n + 1))
  echo "--- example ${n}: ${cmd}"
  out="$(eval "${cmd}" 2>&1)"; rc=$?
  echo "${out}" | head -c 1500; echo
  if [ ${rc} -ne 0 ] || [ -z "${out}" ] || echo "${out}" | grep -q '"error"'; then
    echo "--- example ${n}: FAILED (exit ${rc})"; status=1
  elif ! echo "${out}" | grep -q -e '"choices"' -e 'data: \[DONE\]'; then
    echo "--- example ${n}: FAILED (no choices in the answer)"; status=1
  else
    echo "--- example ${n}: ok"
  fi
done <<<"${examples}"
if [ -n "${oneshot}" ]; then
  timed "oscar run" "${oneshot}" || status=1
fi
kill -TERM "${pid}"; wait "${pid}"; rc=$?
echo "--- serve: stopped (exit ${rc})"
[ ${rc} -eq 0 ] || [ ${rc} -eq 143 ] || status=1
exit ${status}
EOF
  } >"${root}/root/fresh-steps/main.sh"
  {
    echo 'source /root/fresh-steps/lib.sh'
    printf 'echo "README: %s"\n' "${tests//\"/\\\"}"
    printf 'timed_and %q\n' "${tests}"
  } >"${root}/root/fresh-steps/tests.sh"
  {
    echo 'source /root/fresh-steps/lib.sh'
    printf 'export CI=true OSCAR_FUZZ_SECONDS=%q\n' "${OSCAR_FUZZ_SECONDS:-10}"
    echo 'timed ci "bash .ci/run"'
  } >"${root}/root/fresh-steps/ci.sh"
  cat >"${root}/root/fresh-steps/cuda.sh" <<'EOF'
source /root/fresh-steps/lib.sh
why=()
command -v nvcc >/dev/null || why+=("no nvcc on PATH in the chroot (a minbase system has no CUDA toolkit)")
[ -f src/kernels/cuda/CMakeLists.txt ] || why+=("the repository has no CUDA sources (src/kernels/cuda/CMakeLists.txt)")
if [ ${#why[@]} -gt 0 ]; then
  printf 'cuda: skipped: %s\n' "${why[@]}"
  exit 77
fi
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
timed "cuda configure" cmake -S . -B build-cuda "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DOSCAR_CUDA=ON &&
  timed "cuda build" cmake --build build-cuda -j "$(nproc)"
EOF
  echo "steps written; README: '${first}' | '${tests}'; $(grep -c . <<<"${examples}") curl examples; one-shot: '${oneshot}'; port ${port}"
}

# --- run ---------------------------------------------------------------------------------------
t_all="$(now)"
echo "${self}: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n) ($(nproc) cores, $(awk '/^MemTotal/ { printf "%d", $2 / 1048576 }' /proc/meminfo) GiB," \
     "$(. /etc/os-release && echo "${PRETTY_NAME}"), kernel $(uname -r))"
echo "${self}: commit ${commit} of ${repo}; work folder ${work}"
if [ -n "$(git -C "${repo}" status --porcelain --untracked-files=no)" ]; then
  echo "${self}: note: ${repo} has uncommitted changes; only the committed HEAD is checked"
fi

step debootstrap bootstrap || exit 1
step clone clone || exit 1
step steps write_steps || exit 1
if [ -n "$(ls "${root}/usr/local/share/ca-certificates/" 2>/dev/null)" ]; then
  step site-ca in_chroot /usr/sbin/update-ca-certificates || exit 1
fi
for s in main tests ci cuda; do
  case ",${steps}," in *",${s},"*) step "${s}" in_chroot /bin/bash "/root/fresh-steps/${s}.sh" ;; esac
done

echo
echo "=== summary ($(date -u +%Y-%m-%dT%H:%M:%SZ), total $(( $(now) - t_all )) s, commit ${commit:0:7})"
printf '%-12s %-22s %8s\n' step result seconds
for r in "${results[@]}"; do
  IFS='|' read -r n res dt <<<"${r}"
  printf '%-12s %-22s %8s\n' "${n}" "${res}" "${dt}"
done
echo "--- timings and counts inside the steps:"
grep -h -e '^--- time:' -e '^debootstrap:' -e '^packages installed:' -e 'tests passed' \
     -e '^ci: ' -e '^fuzz.sh: .*ok\|^fuzz.sh: all\|FAILED' -e '^cuda: skipped' -e '^--- example .*: ' \
     "${logs}"/*.log 2>/dev/null | grep -v -e '^--- example [0-9]*: curl' || true
echo "chroot size at the end: $(du -sm --one-file-system "${root}" | cut -f1) MB"
if [ "${failed}" -ne 0 ]; then
  echo "${self}: FAILED"
  exit 1
fi
echo "${self}: passed (steps: debootstrap,clone,${steps})"
