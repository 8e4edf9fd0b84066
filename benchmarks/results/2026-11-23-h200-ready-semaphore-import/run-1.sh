#!/bin/bash
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null 2>&1; done; ldconfig
export XDG_RUNTIME_DIR=/tmp VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
r=$OUT; d=.device/exp
{ date -u; nproc; lscpu | grep -E "Model name"; nvidia-smi --query-gpu=name,driver_version --format=csv; } > $r/machine.txt 2>&1
echo "== layer1 ready"; env LF_EXP_READY=1 LF_REQUIRE_VULKAN=1 LF_REQUIRE_CUDA=1 timeout 200 $d/layer1 --test-threads=4 > $r/layer1.txt 2>&1; echo "   (exit $?)"; grep -E "test result|FAILED|panicked" $r/layer1.txt | head
echo "== import probe"; timeout 150 $d/lf-import-probe > $r/import-probe.txt 2>&1; echo "   (exit $?)"; cat $r/import-probe.txt | cut -c1-150
run() { local name=$1; shift
  echo "== $name" >> $r/matrix.txt
  env "$@" timeout 60 $d/lf-gpu-bench --only host > $r/one.txt 2>&1
  grep -E "^  [0-9]+ MiB:|pinned\)|DEVICE_LOCAL (write|read) (from|into) a Vec|host memcpy" $r/one.txt | grep -v "GPU-pinned" >> $r/matrix.txt
}
for round in 1 2 3 4; do
  run old X=1
  run ready LF_EXP_READY=1
  run ready-c2m LF_EXP_READY=1 LF_EXP_CHUNK_KIB=2048 LF_EXP_PIECE_KIB=512
  run ready-c4m LF_EXP_READY=1 LF_EXP_CHUNK_KIB=4096
  run ready-s8 LF_EXP_READY=1 LF_EXP_SLOTS=8 LF_EXP_PIECE_KIB=512
done
rm -f $r/one.txt
