# Sourced by the scripts in scripts/ (and bench/e2e/): checks for a tool before it is used, so that
# a machine without it fails with one line naming the Debian package instead of deep in a build.
#   need COMMAND PACKAGE      e.g. need cmake cmake; need curl curl
# Every package named here is installed by scripts/setup.sh.
need() {
  command -v "$1" >/dev/null 2>&1 && return 0
  echo "$(basename "$0"): '$1' not found: install the Debian package $2 (bash scripts/setup.sh installs every dependency)" >&2
  exit 1
}
