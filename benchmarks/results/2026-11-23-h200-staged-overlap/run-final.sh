#!/bin/bash
# The overlapped staged pipeline (new) against the committed one before it (old), alternated,
# then layer1 with CUDA required and the full lf-gpu-bench of the new build.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null 2>&1; done; ldconfig
export XDG_RUNTIME_DIR=/tmp VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
r=$OUT
{ date -u; nproc; lscpu | grep -E "Model name"; nvidia-smi --query-gpu=name,driver_version --format=csv; } > $r/machine.txt 2>&1
run() { local name=$1 bin=$2
  echo "== $name" >> $r/matrix.txt
  timeout 60 .device/st/$bin --only host > $r/one.txt 2>&1
  grep -E "^  [0-9]+ MiB:|pinned\)|DEVICE_LOCAL (write|read) (from|into) a Vec|host memcpy" $r/one.txt | grep -v "GPU-pinned" >> $r/matrix.txt
}
echo "== layer1"; env LF_REQUIRE_VULKAN=1 LF_REQUIRE_CUDA=1 timeout 200 .device/st/layer1 --test-threads=4 > $r/layer1.txt 2>&1; echo "   (exit $?)"; grep -E "test result|FAILED|panicked" $r/layer1.txt | head
for round in 1 2 3 4; do
  run old lf-gpu-bench-main
  run new lf-gpu-bench-new
done
rm -f $r/one.txt
echo "== lf-gpu-bench"
timeout 200 .device/st/lf-gpu-bench-new > $r/gpu-bench.txt 2>&1; echo "   (exit $?)"
timeout 200 .device/st/lf-gpu-bench-new --json > $r/gpu-bench.json 2> $r/gpu-bench.err; echo "   (exit $?)"
sed -n '/Targets:/,$p' $r/gpu-bench.txt | cut -c1-250
