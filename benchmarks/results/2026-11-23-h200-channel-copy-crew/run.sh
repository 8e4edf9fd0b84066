#!/bin/bash
# Channel sends of large messages copied by the copy crew (default) against one thread
# (LF_COPY_THREADS=1), alternated, with iceoryx2 beside them; then Layer 2's tests.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null 2>&1; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
O=$OUT; d=$PWD/.device/pc
{ date -u; uname -r; nproc; lscpu | sed -n 's/^Model name: *//p'; } > $O/machine.txt 2>&1
for r in 1 2 3; do for v in one crew; do
  if [ $v = one ]; then export LF_COPY_THREADS=1; else unset LF_COPY_THREADS; fi
  echo "== $v round $r"
  timeout 120 $d/lf-bench --modes capi --payloads touch --no-pin --sizes 1M,4M,16M,64M --iceoryx2 $d/iceoryx2-pingpong 2>&1 | grep -E "^[0-9]+ |^touch"
done; done > $O/alternated.txt 2>&1
unset LF_COPY_THREADS


grep -E "^==|C API copy|iceoryx2 " $O/alternated.txt | awk '{print $1,$2,$3,$4,$5,$6}' | head -80
