#!/bin/bash
# The committed tree on the H200 host: what two one-way channels cost with nothing of lava-flow
# in them (benchmarks/ring_layout.c, before and after), lf-bench's C API rows beside iceoryx2 and
# Open MPI (the default run: every size, every target), and the C path's own cost per message on
# one core (benchmarks/msg_path_cost.c). Binaries in .device/h200 (lf-bench,
# iceoryx2-pingpong, liblava_flow.so), built on the x86_64 build machine; Open MPI's ping-pong,
# ring_layout and msg_path_cost are built here. Everything lands in $OUT/results.tar.gz.
set -u
export XDG_RUNTIME_DIR=/tmp
r=/tmp/h200-bounds; rm -rf $r; mkdir -p $r; d=.device/h200
{ date -u; uname -r; nproc; lscpu | sed -n 's/^Model name: *//p'; mpirun --version | head -1; cut -d' ' -f1-3 /proc/loadavg; } > $r/machine.txt 2>&1
cat $r/machine.txt
mpicc -O2 -o /tmp/mpi_pingpong benchmarks/mpi_pingpong.c > $r/mpicc.txt 2>&1 || cat $r/mpicc.txt
cc -O2 -o /tmp/ring_layout benchmarks/ring_layout.c
cc -O2 benchmarks/msg_path_cost.c -Iinclude -L$d -llava_flow -lpthread -o /tmp/msg_path_cost
timeout 90 /tmp/ring_layout 0 1 15 > $r/ring-layout-1.txt 2>&1; tail -2 $r/ring-layout-1.txt
timeout 400 $d/lf-bench --modes capi --iceoryx2 $d/iceoryx2-pingpong \
  --mpi-pingpong /tmp/mpi_pingpong --json-out $r/lf-bench.json > $r/lf-bench.txt 2>&1
echo "lf-bench rc=$?" >> $r/lf-bench.txt
sed -n '/Targets/,$p' $r/lf-bench.txt | cut -c1-160
timeout 90 /tmp/ring_layout 0 1 15 > $r/ring-layout-2.txt 2>&1; tail -2 $r/ring-layout-2.txt
for i in 1 2 3; do LD_LIBRARY_PATH=$d timeout 60 taskset -c 1 /tmp/msg_path_cost 2000000; done > $r/msg-path-cost.txt 2>&1
grep -E "copy|buffer" $r/msg-path-cost.txt | grep none
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $r/machine.txt
tar -czf $OUT/results.tar.gz -C /tmp h200-bounds
