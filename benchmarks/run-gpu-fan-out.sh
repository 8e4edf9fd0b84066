#!/usr/bin/env bash
# A GPU buffer fanned out by reference, beside the pair channel's GPU hand-off, in one run:
# builds lf-bench here (unless SKIP_BUILD=1) and runs `lf-bench --fan-out --gpu` (one producer
# process hands one DEVICE_LOCAL buffer to N consumer processes through the Vulkan IPC route,
# send_buffer + wait_completed until every consumer released it, against the pair channel with
# one consumer; target: the fan-out's hand-off at most 1.5x the pair's), writing into OUTDIR:
#   lf-bench.txt     the report (text): the configuration, the hand-offs size by size, the route
#   lf-bench.json    the same as JSON, each consumer's own result included
#   machine.txt      the date, the command, the machine, the GPU, the load average
#
#   benchmarks/run-gpu-fan-out.sh OUTDIR [lf-bench --fan-out --gpu options, e.g. --quick,
#                                         --consumers 2,4,8, --sizes 4K,1M,64M, --wait spin]
#
# With SKIP_BUILD=1, point LF_BENCH at an lf-bench built elsewhere (with the `vulkan` feature,
# the default). Needs a Vulkan device (lavapipe serves, slowly).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${1:?usage: benchmarks/run-gpu-fan-out.sh OUTDIR [lf-bench --fan-out --gpu options]}
shift
mkdir -p "$out"

if [[ -z ${SKIP_BUILD:-} ]]; then
  export PATH="$HOME/.cargo/bin:$PATH"
  cargo build --release --bin lf-bench
fi
lf_bench=${LF_BENCH:-$root/target/release/lf-bench}

command=("$lf_bench" --fan-out --gpu --json-out "$out/lf-bench.json" "$@")
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "command: benchmarks/run-gpu-fan-out.sh $out $*"
  echo "lf-bench command: ${command[*]}"
  echo "lava-flow commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "kernel: $(uname -r)"
  echo "cpus: $(nproc), $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)"
  echo "gpus: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | paste -sd';' || true)"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$out/machine.txt"

timeout 1800 "${command[@]}" | tee "$out/lf-bench.txt"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/machine.txt"
