#!/usr/bin/env bash
# Batch 10: lf-bench's C API rows (--modes capi) of the tree before the platform layer (8afe769)
# and after (the tree named in machine.txt), alternated four times, then each once more with every mode.
export XDG_RUNTIME_DIR=/tmp
D=$PWD/.device; R=$OUT/r; mkdir -p $R
s() { local n=$1; shift; local t0=$(date +%s); "$@" > $R/$n.txt 2>&1; echo "== $n rc=$? $(( $(date +%s)-t0 ))s"; }
{ date -u; echo after: ab98316; nproc; lscpu | grep "Model name"; cat /proc/loadavg; } > $R/machine.txt 2>&1
for r in 1 2 3 4; do
  for w in before after; do
    s capi-$w-$r timeout 120 $D/$w/lf-bench --quick --modes capi --json-out $R/capi-$w-$r.json
  done
done
for w in after before; do
  s all-$w timeout 120 $D/$w/lf-bench --quick --json-out $R/all-$w.json
done
tar -C $OUT -czf $OUT/results.tgz r
