#!/bin/bash
# The H200 run of this directory (run from the repository root on the device host).
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
O=$OUT
{ date -u; uname -r; nproc; lscpu | sed -n 's/^Model name: *//p'; mpirun --version | head -1; } > $O/machine.txt 2>&1
mpicc -std=c99 -O2 -o /tmp/mpi_pingpong benchmarks/mpi_pingpong.c || echo "mpicc failed"
gcc -O2 benchmarks/msg_path_cost.c -Iinclude -L.device/lib -llava_flow -lpthread -o /tmp/mpc || echo "cc failed"
for i in 1 2 3; do LD_LIBRARY_PATH=.device/lib taskset -c 1 timeout 60 /tmp/mpc 2000000; done > $O/msg_path_cost.txt 2>&1
SKIP_BUILD=1 LF_BENCH=$PWD/.device/lf-bench LF_BENCH_ICEORYX2=$PWD/.device/iceoryx2-pingpong LF_BENCH_MPI_PINGPONG=/tmp/mpi_pingpong \
  timeout 200 benchmarks/run-peers.sh /tmp/peers-3 --modes capi > $O/peers-3.log 2>&1
cp /tmp/peers-3/lf-bench.json $O/peers-3.json
for r in 1 2 3; do
  for b in lf-bench-before lf-bench; do
    echo "== $b round $r"; timeout 60 .device/$b --quick --modes capi --no-peers --sizes 8,64,256,4K 2>&1 | grep -E "^  C API|^[0-9].*B, |^[0-9].*KiB, "
  done
done > $O/before-after-capi-2.txt 2>&1
LF_TEST_TIMEOUT=60 timeout 240 .device/layer2 > $O/layer2-2.txt 2>&1; echo "layer2 rc=$?" >> $O/layer2-2.txt
