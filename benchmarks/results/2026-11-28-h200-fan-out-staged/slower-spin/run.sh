#!/usr/bin/env bash
# Consumers that pause 4x per spin, with the send as before and with the burst publish.
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
[ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] && export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
D=$PWD/.device/fo; R=$OUT/r; mkdir -p $R
pgrep -a nvidia-cuda-mps > $R/mps.txt || echo "MPS: not running" > $R/mps.txt
export SKIP_BUILD=1
for i in 1 2 3; do
  for v in old old-p4 staged-p4; do
    LF_BENCH=$D/lf-bench-$v timeout 100 benchmarks/run-gpu-fan-out.sh $R/$v-$i --consumers 1,4 --sizes 4K,1M > $R/$v-$i.log 2>&1
    echo "$v-$i rc=$?"; grep -E "fan-out to|pair" $R/$v-$i/lf-bench.txt | grep -v "^#"
  done
done
tar -C $OUT -czf $OUT/results.tgz r
