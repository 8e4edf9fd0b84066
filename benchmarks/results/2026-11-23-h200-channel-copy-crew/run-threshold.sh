#!/bin/bash
# Where the copy crew starts paying for channel messages: thresholds 2 MiB (committed), 1 MiB,
# 512 KiB, alternated, unpinned, touched copies beside iceoryx2.
set -u
export XDG_RUNTIME_DIR=/tmp
O=$OUT; d=$PWD/.device/mm
for r in 1 2 3; do for v in 2048 1024 512; do
  echo "== min$v round $r"
  LF_EXP_MSG_MIN_KIB=$v timeout 120 $d/lf-bench --modes capi --payloads touch --no-pin --sizes 256K,512K,1M,2M --iceoryx2 $d/iceoryx2-pingpong 2>&1 | grep -E "^[0-9]+ "
done; done > $O/alternated.txt 2>&1
grep -E "^==|C API copy" $O/alternated.txt | awk '{print $1,$2,$3,$4,$5,$6}'
