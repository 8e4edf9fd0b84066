#!/bin/bash
# Pool loans below the hot window without the consumer's tail read (after) against the build
# that read it for loans of 16 KiB and more (before): lf-bench's C API rows, touched, in turns.
#   benchmarks/results/2026-11-23-ci-pool-tail-reads/run.sh BEFORE AFTER ROUNDS > ab.txt
before=$1 after=$2 rounds=${3:-5}
echo "# date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); $(nproc) cpus, $(lscpu | sed -n 's/^Model name: *//p'); load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# each line: size/sender p50 us (x the copy-and-read floor probed around the case)"
for round in $(seq "$rounds"); do
  for build in before after; do
    bin=$before; [ $build = after ] && bin=$after
    echo "$build $(XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp} "$bin" --modes capi --sizes 1K,4K,16K,64K,128K,256K,1M \
      --no-peers --payloads touch --iters 10000 2>&1 | grep -E '^[0-9]+ .*C API (copy|loan)' |
      awk '{printf "%s/%s %s(%s) ", $1, $4, $5, $10}')"
  done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
