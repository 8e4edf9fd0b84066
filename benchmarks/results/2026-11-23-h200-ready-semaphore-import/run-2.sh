#!/bin/bash
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null 2>&1; done; ldconfig
export XDG_RUNTIME_DIR=/tmp VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
r=$OUT; d=.device/exp
run() { local name=$1; shift
  echo "== $name" >> $r/matrix.txt
  env "$@" timeout 60 $d/lf-gpu-bench --only host > $r/one.txt 2>&1
  grep -E "^  [0-9]+ MiB:|pinned\)|DEVICE_LOCAL (write|read) (from|into) a Vec|host memcpy" $r/one.txt | grep -v "GPU-pinned" >> $r/matrix.txt
}
for round in 1 2 3 4; do
  run old X=1
  run nobar LF_EXP_NOBARRIER=1
  run readynb LF_EXP_READY=1 LF_EXP_NOBARRIER=1
  run nbc4m LF_EXP_NOBARRIER=1 LF_EXP_CHUNK_KIB=4096 LF_EXP_PIECE_KIB=512
done
cp $r/one.txt $r/last-full.txt
