#!/usr/bin/env bash
# lava-flow beside its peers, in one run: builds what is missing here and runs lf-bench's full
# comparison (the C API headline with floors probed around every case, iceoryx2 and Open MPI on
# the same two cores, the targets; then the Rust API rows), writing into OUTDIR:
#   lf-bench.txt     the report (text): the configuration, then OSU-style tables, the targets
#   lf-bench.json    the same as JSON: the configuration, every row, floors before and after,
#                    peers, targets
#   charts/          latency-vs-size and bandwidth-vs-size charts, SVG and PNG (lf-bench --plot)
#   machine.txt      the date, the command, the machine, the versions
#
#   benchmarks/run-peers.sh OUTDIR [lf-bench options, e.g. --quick]
#
# Builds (unless SKIP_BUILD=1): `cargo build --release --bin lf-bench`, the peers crate
# (benchmarks/peers: iceoryx2-pingpong) and, where mpicc exists, benchmarks/mpi_pingpong.c.
# On a machine without Rust, set SKIP_BUILD=1 and point LF_BENCH and LF_BENCH_ICEORYX2 at
# binaries built elsewhere (LF_BENCH_MPI_PINGPONG too, where mpicc is missing). A peer that is
# not found is skipped, and the report says so.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${1:?usage: benchmarks/run-peers.sh OUTDIR [lf-bench options]}
shift
mkdir -p "$out"

if [[ -z ${SKIP_BUILD:-} ]]; then
  export PATH="$HOME/.cargo/bin:$PATH"
  cargo build --release --bin lf-bench
  cargo build --release --manifest-path benchmarks/peers/Cargo.toml
fi
lf_bench=${LF_BENCH:-$root/target/release/lf-bench}
export LF_BENCH_ICEORYX2=${LF_BENCH_ICEORYX2:-$root/benchmarks/peers/target/release/iceoryx2-pingpong}
if [[ -z ${LF_BENCH_MPI_PINGPONG:-} ]]; then
  if command -v mpicc >/dev/null; then
    mkdir -p "$root/target/peers"
    mpicc -std=c99 -O2 -o "$root/target/peers/mpi_pingpong" benchmarks/mpi_pingpong.c
    export LF_BENCH_MPI_PINGPONG=$root/target/peers/mpi_pingpong
  else
    echo "run-peers: mpicc not found: Open MPI will be skipped (install libopenmpi-dev openmpi-bin)" >&2
  fi
fi

command=("$lf_bench" --json-out "$out/lf-bench.json" --plot "$out/charts" "$@")
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "command: benchmarks/run-peers.sh $out $*"
  echo "lf-bench command: ${command[*]}"
  echo "lava-flow commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "kernel: $(uname -r)"
  echo "cpus: $(nproc), $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "iceoryx2: $(grep -A1 '^name = "iceoryx2"$' benchmarks/peers/Cargo.lock | sed -n 's/^version = //p' | tr -d '"') ($LF_BENCH_ICEORYX2)"
  echo "Open MPI: $(mpirun --version 2>/dev/null | head -1 || echo 'not found') (${LF_BENCH_MPI_PINGPONG:-no mpi_pingpong})"
} | tee "$out/machine.txt"

timeout 3600 "${command[@]}" | tee "$out/lf-bench.txt"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/machine.txt"
