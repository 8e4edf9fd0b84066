#!/usr/bin/env bash
# lava-flow's fan-in beside its peers, in one run: builds what is missing here and runs
# `lf-bench --fan-in` (N producers to one consumer through the C API, the pair channel beside
# it, iceoryx2 with N publishers on one service, Open MPI with N ranks to rank 0 and
# MPI_ANY_SOURCE), writing into OUTDIR:
#   lf-bench.txt     the report (text): the configuration (cores and how the processes share
#                    them), per-message cost, aggregate throughput and fairness, the target
#   lf-bench.json    the same as JSON
#   machine.txt      the date, the command, the machine, the versions
#
#   benchmarks/run-fan-in.sh OUTDIR [lf-bench --fan-in options, e.g. --quick, --producers 1,2,4,8]
#
# Builds (unless SKIP_BUILD=1): `cargo build --release --bin lf-bench`, the peers crate
# (benchmarks/peers: iceoryx2-fanin) and, where mpicc exists, benchmarks/mpi_fanin.c. With
# SKIP_BUILD=1, point LF_BENCH, LF_BENCH_ICEORYX2_FANIN and LF_BENCH_MPI_FANIN at binaries built
# elsewhere. A peer that is not found is skipped, and the report says so.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${1:?usage: benchmarks/run-fan-in.sh OUTDIR [lf-bench --fan-in options]}
shift
mkdir -p "$out"

if [[ -z ${SKIP_BUILD:-} ]]; then
  export PATH="$HOME/.cargo/bin:$PATH"
  cargo build --release --bin lf-bench
  cargo build --release --manifest-path benchmarks/peers/Cargo.toml
fi
lf_bench=${LF_BENCH:-$root/target/release/lf-bench}
export LF_BENCH_ICEORYX2_FANIN=${LF_BENCH_ICEORYX2_FANIN:-$root/benchmarks/peers/target/release/iceoryx2-fanin}
if [[ -z ${LF_BENCH_MPI_FANIN:-} ]]; then
  if command -v mpicc >/dev/null; then
    mkdir -p "$root/target/peers"
    mpicc -std=c99 -O2 -o "$root/target/peers/mpi_fanin" benchmarks/mpi_fanin.c
    export LF_BENCH_MPI_FANIN=$root/target/peers/mpi_fanin
  else
    echo "run-fan-in: mpicc not found: Open MPI will be skipped (install libopenmpi-dev openmpi-bin)" >&2
  fi
fi

command=("$lf_bench" --fan-in --json-out "$out/lf-bench.json" "$@")
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "command: benchmarks/run-fan-in.sh $out $*"
  echo "lf-bench command: ${command[*]}"
  echo "lava-flow commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "kernel: $(uname -r)"
  echo "cpus: $(nproc), $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "iceoryx2: $(grep -A1 '^name = "iceoryx2"$' benchmarks/peers/Cargo.lock | sed -n 's/^version = //p' | tr -d '"') ($LF_BENCH_ICEORYX2_FANIN)"
  echo "Open MPI: $(mpirun --version 2>/dev/null | head -1 || echo 'not found') (${LF_BENCH_MPI_FANIN:-no mpi_fanin})"
} | tee "$out/machine.txt"

timeout 1800 "${command[@]}" | tee "$out/lf-bench.txt"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/machine.txt"
