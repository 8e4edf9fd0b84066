#!/usr/bin/env bash
# The session's device run: every fan-in/fan-out benchmark, results tarred into $OUT.
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
D=$PWD/.device
export SKIP_BUILD=1 LF_BENCH=$D/lf-bench LF_BENCH_ICEORYX2_FANIN=$D/peers/target/release/iceoryx2-fanin \
  LF_BENCH_ICEORYX2_FANOUT=$D/peers/target/release/iceoryx2-fanout OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p target/peers && mpicc -std=c99 -O2 -o target/peers/mpi_fanin benchmarks/mpi_fanin.c
export LF_BENCH_MPI_FANIN=$PWD/target/peers/mpi_fanin
R=$OUT/r; mkdir -p $R
echo "binaries: lf-bench built from $(cat $D/commit 2>/dev/null)" > $R/binaries.txt
pgrep -a nvidia-cuda-mps >> $R/binaries.txt || echo "MPS: not running" >> $R/binaries.txt
step() { local s=$(date +%s); "$@" > "$R/$(basename ${2:-x}).log" 2>&1; echo "$* rc=$? $(( $(date +%s)-s ))s"; }
for i in 1 2 3; do step timeout 120 benchmarks/run-gpu-fan-out.sh $R/gpu-fan-out-$i --consumers 1,2,4,8; done
for i in 1 2; do step timeout 200 benchmarks/run-fan-in.sh $R/fan-in-$i; done
step timeout 200 benchmarks/run-fan-out.sh $R/fan-out
step timeout 200 benchmarks/run-fan-in-mpi.sh $R/fan-in-mpi --producers 1,2,4,8 --rounds 3
tar -C $OUT -czf $OUT/results.tgz r && rm -rf $R
for f in $(tar -tzf $OUT/results.tgz | grep 'lf-bench.txt\|report.txt'); do :; done
