#!/bin/bash
# The committed tree on the H200 host: lf-bench's C API rows beside iceoryx2 and Open MPI (the
# default run: every size, every target), the ring's cost beside the spinning floor, and Layer
# 2's tests. Binaries in .device/h200 (lf-bench, layer2, peers/target/release/iceoryx2-pingpong
# with the peers crate's Cargo.lock), built on the x86_64 build machine; Open MPI's ping-pong is
# built here. Everything lands in $OUT/results.tar.gz.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null 2>&1; done; ldconfig
export XDG_RUNTIME_DIR=/tmp VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
r=/tmp/h200-final; rm -rf $r; mkdir -p $r; d=.device/h200
{ date -u; uname -r; nproc; lscpu | sed -n 's/^Model name: *//p'; mpirun --version | head -1; cut -d' ' -f1-3 /proc/loadavg; } > $r/machine.txt 2>&1
cat $r/machine.txt
mpicc -O2 -o /tmp/mpi_pingpong benchmarks/mpi_pingpong.c > $r/mpicc.txt 2>&1 || cat $r/mpicc.txt
timeout 500 $d/lf-bench --modes capi --iceoryx2 $d/peers/target/release/iceoryx2-pingpong \
  --mpi-pingpong /tmp/mpi_pingpong --json-out $r/lf-bench.json > $r/lf-bench.txt 2>&1
echo "lf-bench rc=$?" >> $r/lf-bench.txt
sed -n '/Targets/,$p' $r/lf-bench.txt | cut -c1-160
cc -O2 -o /tmp/ring_layout benchmarks/ring_layout.c && timeout 60 /tmp/ring_layout 0 1 7 > $r/ring-layout.txt 2>&1
tail -1 $r/ring-layout.txt
LF_TEST_TIMEOUT=60 timeout 120 $d/layer2 > $r/layer2.txt 2>&1; echo "layer2 rc=$?" >> $r/layer2.txt
tail -2 $r/layer2.txt
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $r/machine.txt
tar -czf $OUT/results.tar.gz -C /tmp h200-final
