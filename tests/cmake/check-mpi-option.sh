#!/usr/bin/env bash
# LAVA_FLOW_MPI as a user meets it, by configuring the top-level project (no build, a few
# seconds each) into WORKDIR:
#   - the default (AUTO) has MPI where a C MPI is installed (mpicc here), and says which;
#   - AUTO where CMake finds none still configures, without MPI, saying what to install;
#   - OFF has no MPI; ON without an MPI fails, naming what to install;
#   - `mpi` in LAVA_FLOW_FEATURES means ON, and contradicts OFF.
# "No MPI" is CMAKE_DISABLE_FIND_PACKAGE_MPI, which hides the installed one from find_package.
# Run by scripts/test.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:?usage: tests/cmake/check-mpi-option.sh WORKDIR}
rm -rf "$work"
mkdir -p "$work"

fail() {
  echo "check-mpi-option: $*" >&2
  exit 1
}

# configure NAME ARGS...: configures into $work/NAME, output in $work/NAME.log; its status.
configure() {
  local name=$1
  shift
  cmake -S "$root" -B "$work/$name" -DBUILD_TESTING=OFF -DLAVA_FLOW_BUILD_EXAMPLES=OFF "$@" \
    >"$work/$name.log" 2>&1
}

# expect_mpi NAME 0|1: the generated feature header, the cargo features and the package config
# of configuration NAME agree that it has MPI (1) or not (0).
expect_mpi() {
  local name=$1 want=$2 dir=$work/$1 macro features with
  macro=$(sed -n 's/^#define LAVA_FLOW_FEATURE_MPI \([01]\)$/\1/p' "$dir/include/lava_flow_features.h")
  features=$(sed -n 's/^LAVA_FLOW_CARGO_FEATURES:INTERNAL=//p' "$dir/CMakeCache.txt")
  with=$(sed -n 's/^set(LAVA_FLOW_WITH_MPI \(ON\|OFF\))$/\1/p' "$dir/LavaFlowConfig.cmake")
  if [[ $want == 1 ]]; then
    [[ $macro == 1 && ,$features, == *,mpi,* && $with == ON ]] ||
      fail "$name: expected MPI, got LAVA_FLOW_FEATURE_MPI=$macro, cargo features '$features', package LAVA_FLOW_WITH_MPI=$with (log: $dir.log)"
  else
    [[ $macro == 0 && ,$features, != *,mpi,* && $with == OFF ]] ||
      fail "$name: expected no MPI, got LAVA_FLOW_FEATURE_MPI=$macro, cargo features '$features', package LAVA_FLOW_WITH_MPI=$with (log: $dir.log)"
  fi
}

# expect_said NAME TEXT: configuration NAME's output says TEXT.
expect_said() {
  grep -qF -- "$2" "$work/$1.log" || fail "$1: the configure output does not say '$2' (log: $work/$1.log)"
}

command -v mpicc >/dev/null ||
  fail "mpicc is not installed, so the default configure cannot be checked to find MPI: install libopenmpi-dev openmpi-bin (scripts/install-deps.sh does)"

configure auto || fail "the default configure failed (log: $work/auto.log)"
expect_mpi auto 1
expect_said auto "lava-flow MPI: on, channels between hosts built in (CMake found MPI automatically: "
# The choice reaches cargo, which records it in lf-info.
grep -qF "mpi: CMake found MPI automatically: " "$work/auto/cargo-features.txt" ||
  fail "auto: cargo-features.txt does not carry the MPI choice to cargo"

configure off -DLAVA_FLOW_MPI=OFF || fail "the configure with -DLAVA_FLOW_MPI=OFF failed (log: $work/off.log)"
expect_mpi off 0
expect_said off "lava-flow MPI: off (LAVA_FLOW_MPI=OFF)"

configure auto-none -DCMAKE_DISABLE_FIND_PACKAGE_MPI=TRUE ||
  fail "the default configure without an MPI failed; it must build without MPI (log: $work/auto-none.log)"
expect_mpi auto-none 0
expect_said auto-none "CMake found no C MPI: install Open MPI's development package (Debian/Ubuntu: libopenmpi-dev openmpi-bin"
expect_said auto-none "-DLAVA_FLOW_MPI=OFF builds without it"

if configure on-none -DLAVA_FLOW_MPI=ON -DCMAKE_DISABLE_FIND_PACKAGE_MPI=TRUE; then
  fail "-DLAVA_FLOW_MPI=ON configured without an MPI; it must fail (log: $work/on-none.log)"
fi
expect_said on-none "LAVA_FLOW_MPI=ON requires a C MPI, and CMake found none"
expect_said on-none "libopenmpi-dev openmpi-bin"

configure features -DLAVA_FLOW_FEATURES=mpi || fail "the configure with LAVA_FLOW_FEATURES=mpi failed (log: $work/features.log)"
expect_mpi features 1
expect_said features "(LAVA_FLOW_FEATURES names mpi: "

if configure features-off -DLAVA_FLOW_FEATURES=mpi -DLAVA_FLOW_MPI=OFF; then
  fail "LAVA_FLOW_FEATURES=mpi with -DLAVA_FLOW_MPI=OFF configured; the contradiction must fail (log: $work/features-off.log)"
fi
expect_said features-off "LAVA_FLOW_FEATURES names mpi but LAVA_FLOW_MPI is OFF"

echo "LAVA_FLOW_MPI: the default finds $(sed -n 's/^mpi: CMake found MPI automatically: //p' "$work/auto/cargo-features.txt");" \
  "OFF, and AUTO without an MPI, build without; ON without an MPI fails, saying what to install"
