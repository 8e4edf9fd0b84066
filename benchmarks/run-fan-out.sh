#!/usr/bin/env bash
# lava-flow's fan-out beside iceoryx2, in one run: builds what is missing here and runs
# `lf-bench --fan-out` (one producer to N consumers through the C API: 1 MiB by reference, the
# producer's send and its cycle until every consumer released the buffer, the pair channel
# beside it; iceoryx2 with N subscribers on one service; 64 B copies), writing into OUTDIR:
#   lf-bench.txt     the report (text): the configuration (cores and how the processes share
#                    them), the producer's cost by reference with what every consumer got, the
#                    copies, the target
#   lf-bench.json    the same as JSON, each consumer's own result included
#   machine.txt      the date, the command, the machine, the versions, the load average
#
#   benchmarks/run-fan-out.sh OUTDIR [lf-bench --fan-out options, e.g. --quick, --consumers 1,2,4,8]
#
# A GPU buffer fanned out by reference: benchmarks/run-gpu-fan-out.sh (lf-bench --fan-out --gpu).
#
# Builds (unless SKIP_BUILD=1): `cargo build --release --bin lf-bench` and the peers crate
# (benchmarks/peers: iceoryx2-fanout). With SKIP_BUILD=1, point LF_BENCH and
# LF_BENCH_ICEORYX2_FANOUT at binaries built elsewhere (neither needs a Rust toolchain to run).
# A peer that is not found is skipped, and the report says so.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${1:?usage: benchmarks/run-fan-out.sh OUTDIR [lf-bench --fan-out options]}
shift
mkdir -p "$out"

if [[ -z ${SKIP_BUILD:-} ]]; then
  export PATH="$HOME/.cargo/bin:$PATH"
  cargo build --release --bin lf-bench
  cargo build --release --manifest-path benchmarks/peers/Cargo.toml
fi
lf_bench=${LF_BENCH:-$root/target/release/lf-bench}
export LF_BENCH_ICEORYX2_FANOUT=${LF_BENCH_ICEORYX2_FANOUT:-$root/benchmarks/peers/target/release/iceoryx2-fanout}

command=("$lf_bench" --fan-out --json-out "$out/lf-bench.json" "$@")
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "command: benchmarks/run-fan-out.sh $out $*"
  echo "lf-bench command: ${command[*]}"
  echo "lava-flow commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "kernel: $(uname -r)"
  echo "cpus: $(nproc), $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "iceoryx2: $(grep -A1 '^name = "iceoryx2"$' benchmarks/peers/Cargo.lock | sed -n 's/^version = //p' | tr -d '"') ($LF_BENCH_ICEORYX2_FANOUT)"
} | tee "$out/machine.txt"

timeout 1800 "${command[@]}" | tee "$out/lf-bench.txt"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/machine.txt"
