#!/bin/bash
# The C message path before and after the instruction trims, on the H200 host: msg_path_cost
# and lf-bench's C API rows alternated, then the full comparison beside iceoryx2 and Open MPI,
# then Layer 2's tests.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null 2>&1; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
O=$OUT; d=$PWD/.device/mp
{ date -u; uname -r; nproc; lscpu | sed -n 's/^Model name: *//p'; mpirun --version | head -1; } > $O/machine.txt 2>&1
mpicc -std=c99 -O2 -o /tmp/mpi_pingpong benchmarks/mpi_pingpong.c || echo "mpicc failed"
for v in old new; do cc -O2 benchmarks/msg_path_cost.c -Iinclude -L$d/$v -llava_flow -lpthread -Wl,-rpath,$d/$v -o /tmp/mpc_$v; done
for r in 1 2 3; do for v in old new; do echo "== msg_path_cost $v round $r"; LF_DISABLE_CUDA=1 taskset -c 1 timeout 60 /tmp/mpc_$v 2000000; done; done > $O/msg-path-cost.txt 2>&1
for r in 1 2 3; do for v in old new; do
  echo "== lf-bench $v round $r"; timeout 90 $d/$v/lf-bench --quick --modes capi --no-peers --sizes 8,64,1K 2>&1 | grep -E "^  C API|^[0-9].*B, |^[0-9].*KiB, "
done; done > $O/before-after-capi.txt 2>&1
SKIP_BUILD=1 LF_BENCH=$d/new/lf-bench LF_BENCH_ICEORYX2=$d/iceoryx2-pingpong LF_BENCH_MPI_PINGPONG=/tmp/mpi_pingpong \
  timeout 300 benchmarks/run-peers.sh /tmp/peers --modes capi > $O/peers.log 2>&1
cp /tmp/peers/lf-bench.json $O/peers.json 2>/dev/null; cp /tmp/peers/lf-bench.txt $O/peers.txt 2>/dev/null
LF_TEST_TIMEOUT=60 timeout 200 $d/layer2 > $O/layer2.txt 2>&1; echo "layer2 rc=$?" >> $O/layer2.txt
tail -3 $O/layer2.txt
grep -E "^==|copy|loan|buffer" $O/msg-path-cost.txt | head -40
cat $O/before-after-capi.txt | head -60
