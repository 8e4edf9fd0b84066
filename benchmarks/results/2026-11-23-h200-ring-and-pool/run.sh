#!/bin/bash
# On the H200 host, in one run: whether a plain ring costs more than the spinning floor
# (ring_layout.c), and lf-bench's C API rows from five builds taken in turns:
#   head    the committed tree
#   before  pool loans reading the consumer's tail for every loan of 16 KiB or more
#   hot2m   the committed tree with a 2 MiB hot window instead of 512 KiB
#   read    the producer loading the next slot's sequence word after it publishes
#   pfw     the producer prefetching the next slot's line for writing after it publishes
# then Layer 2's tests. Binaries in .device/h200 (lf-bench-<build>, layer2), built on the
# x86_64 build machine; results under $OUT.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null 2>&1; done; ldconfig
export XDG_RUNTIME_DIR=/tmp VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
O=$OUT; d=.device/h200
{ date -u; uname -r; nproc; lscpu | sed -n 's/^Model name: *//p'; cut -d' ' -f1-3 /proc/loadavg; } > $O/machine.txt 2>&1
cat $O/machine.txt
cc -O2 -o /tmp/ring_layout benchmarks/ring_layout.c && timeout 90 /tmp/ring_layout 0 1 7 > $O/ring-layout.txt 2>&1
tail -1 $O/ring-layout.txt
# each summary line: build size/sender p50 us (x floor)
rows() { grep -E '^[0-9]+ +C API' | awk '{printf "%s/%s%s %s(%s) ", $1, $4, ($5=="send"?"":""), ($5=="send"?$6:$5), ($5=="send"?$11:$10)}'; }
for round in 1 2 3 4 5; do
  for b in head read pfw; do
    $d/lf-bench-$b --modes capi --sizes 8,64,1K,4K --no-peers --payloads zero-copy,touch,buf-touch --iters 20000 \
      > $O/small-$b-$round.txt 2>&1
    echo "small $b $(rows < $O/small-$b-$round.txt)"
  done
done | tee $O/small.txt | cut -c1-400
for round in 1 2 3; do
  for b in before head hot2m; do
    $d/lf-bench-$b --modes capi --sizes 16K,64K,128K,256K,1M --no-peers --payloads touch --iters 3000 \
      > $O/pool-$b-$round.txt 2>&1
    echo "pool $b $(rows < $O/pool-$b-$round.txt)"
  done
done | tee $O/pool.txt | cut -c1-400
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $O/machine.txt
LF_TEST_TIMEOUT=60 timeout 150 $d/layer2 > $O/layer2.txt 2>&1; echo "layer2 rc=$?" >> $O/layer2.txt
tail -3 $O/layer2.txt
