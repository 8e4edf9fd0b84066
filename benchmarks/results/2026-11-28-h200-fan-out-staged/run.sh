#!/usr/bin/env bash
# Fan-out send variants alternated, with the floor probe before and after.
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
[ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] && export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
D=$PWD/.device/fo; R=$OUT/r; mkdir -p $R
pgrep -a nvidia-cuda-mps > $R/mps.txt || echo "MPS: not running" > $R/mps.txt
cc -O2 benchmarks/fan_out_floor.c -o /tmp/floor
/tmp/floor 4 3 > $R/floor-before.txt 2>&1
export SKIP_BUILD=1
for i in 1 2 3 4; do
  for v in old staged staged-pf; do
    LF_BENCH=$D/lf-bench-$v timeout 100 benchmarks/run-gpu-fan-out.sh $R/$v-$i --consumers 1,4 --sizes 4K,1M > $R/$v-$i.log 2>&1
    echo "$v-$i rc=$?"; grep -E "fan-out to 4|pair" $R/$v-$i/lf-bench.txt | grep -v "^#"
  done
done
/tmp/floor 4 3 > $R/floor-after.txt 2>&1
tail -9 $R/floor-before.txt; tail -9 $R/floor-after.txt
tar -C $OUT -czf $OUT/results.tgz r
