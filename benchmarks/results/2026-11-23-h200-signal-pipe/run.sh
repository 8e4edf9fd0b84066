#!/bin/bash
# The channels' event-loop signal through a pipe, and buffer sends that never wait on the
# socket: Layer 2 on the H200 host, then the C API headline beside iceoryx2 and Open MPI, then
# the Rust API's busy-poll rows, whose floors include the minimal ring.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null 2>&1; done; ldconfig
export XDG_RUNTIME_DIR=/tmp VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
O=$OUT; d=.device/s7
mpicc -O2 $d/mpi_pingpong.c -o $d/mpi_pingpong > $O/mpicc.txt 2>&1
{ date -u; uname -r; nproc; lscpu | sed -n 's/^Model name: *//p'; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $O/machine.txt 2>&1
LF_TEST_TIMEOUT=60 timeout 200 $d/layer2 > $O/layer2.txt 2>&1; echo "layer2 rc=$?" >> $O/layer2.txt
timeout 250 $d/lf-bench --modes capi --iceoryx2 $d/iceoryx2-pingpong > $O/lf-bench.txt 2>&1; echo "bench rc=$?" >> $O/lf-bench.txt
timeout 100 $d/lf-bench --modes busy --payloads zero-copy --sizes 8,64 > $O/lf-bench-busy.txt 2>&1; echo "busy rc=$?" >> $O/lf-bench-busy.txt
tail -2 $O/layer2.txt; sed -n '/Targets/,$p' $O/lf-bench.txt | cut -c1-220; grep -i -E "ring|spinning|rc=" $O/lf-bench-busy.txt | head -20
