#!/bin/bash
# Runs lava-flow's GPU tests, the CUDA examples and the GPU benchmarks (lf-bench --gpu, and a
# CUDA ping-pong over lava-flow channels next to the same over plain CUDA IPC, and the
# application's own CUDA memory handed off over lava-flow next to plain CUDA IPC, with and
# without the MPS daemon) on a machine with NVIDIA GPUs but no Rust
# toolchain. Logs go to $OUT/results.tar.gz (and a summary to stdout). Prepare, on the build
# machine:
#   .device/layer1, .device/layer2, .device/libtests   cargo test --release --all-features --no-run
#                                                      (the binaries it names, stripped)
#   .device/lf-bench, .device/lf-gpu-bench             cargo build --release --all-features --bin ...
#   .device/lf-gpu-bench-before (optional)             the same from an earlier commit, to compare
#   .device/lf-bench-mpi (optional)                    lf-bench with the mpi feature (needs the host's libmpi)
#   .device/prefix          cmake --install of a Release build (-DBUILD_TESTING=OFF)
#   .gl/*.deb               the Vulkan loader packages (libvulkan1 etc.), when the host lacks one
#   .device/lava_flow-*.whl (optional)                 python3 -m pip wheel --no-deps -w .device ./crates/python
#   .device/py/*.whl        with it: pytest and its needs (python3 -m pip download -d .device/py pytest)
#                           and then Python's GPU hand-off beside torch.multiprocessing and the C
#                           path (benchmarks/python_gpu_handoff.py), with and without MPS
# SKIP_BENCH=1 runs only the tests and the examples.
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
if [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
export XDG_RUNTIME_DIR=/tmp PATH=/usr/local/cuda/bin:$PATH
res=/tmp/lf-results; rm -rf $res; mkdir -p $res
{ date -u; uname -r; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc; } 2>&1 | tee $res/machine.txt
run() { local name=$1; shift; echo "== $name"; "$@" > $res/$name.txt 2>&1; local rc=$?; tail -${TAIL:-4} $res/$name.txt; echo "   (exit $rc)"; }
TAIL=3 run layer1-tests env LF_REQUIRE_VULKAN=1 LF_REQUIRE_CUDA=1 timeout 300 .device/layer1 --test-threads=1
TAIL=3 run lib-tests env LF_REQUIRE_VULKAN=1 timeout 120 .device/libtests --test-threads=1
TAIL=3 run layer2-tests env LF_REQUIRE_VULKAN=1 timeout 300 .device/layer2 --test-threads=2
grep -E "^test gpu::|staged|vulkan_ipc" $res/layer2-tests.txt | head -20
have_wheel=
if ls .device/lava_flow-*.whl > /dev/null 2>&1; then
  have_wheel=1
  # The Python package: its whole suite, with DLPack into torch and cupy and the GPU messages'
  # stream waits (tests/test_gpu.py), on the host's python3 (the one that holds PyTorch).
  python3 -m pip install -q --no-index --no-deps --target /tmp/lfpy .device/lava_flow-*.whl .device/py/*.whl
  TAIL=8 run python-tests env PYTHONPATH=/tmp/lfpy timeout 300 python3 -m pytest -v -rs crates/python/tests
fi
echo "== CUDA examples against the installed prefix"
(cmake -S examples-cpp -B /tmp/bc -DCMAKE_PREFIX_PATH=$PWD/.device/prefix && cmake --build /tmp/bc -j16 && LD_LIBRARY_PATH=$PWD/.device/prefix/lib ctest --test-dir /tmp/bc --output-on-failure -V) > $res/cuda-examples.txt 2>&1
grep -E "PASS|FAIL|Passed|Failed|cuda imports|semaphore|transport" $res/cuda-examples.txt | head -20
echo "== C examples (the two-process channel demo with its GPU phase) against the installed prefix"
(cmake -S examples-c -B /tmp/bcc "-DCMAKE_PREFIX_PATH=$PWD/.device/prefix;/usr/local/cuda" && cmake --build /tmp/bcc -j16 && LD_LIBRARY_PATH=$PWD/.device/prefix/lib ctest --test-dir /tmp/bcc --output-on-failure -V) > $res/c-examples.txt 2>&1
grep -E "GPU buffers|channel demo passed|Passed|Failed|Not Run" $res/c-examples.txt | head -12
nvcc -O2 -o /tmp/cuda_ipc_pingpong benchmarks/cuda_ipc_pingpong.cu > $res/nvcc.txt 2>&1 || cat $res/nvcc.txt
prefix=$PWD/.device/prefix
nvcc -O2 -I$prefix/include -L$prefix/lib -Xlinker -rpath=$prefix/lib -llava_flow -o /tmp/lf_cuda_pingpong benchmarks/lf_cuda_pingpong.cu >> $res/nvcc.txt 2>&1 || cat $res/nvcc.txt
# The application's own CUDA memory (cuMemAlloc, VMM) by reference over the cuda_ipc route,
# beside plain CUDA IPC in the same program: plain C, the driver loaded with dlopen.
cc -O2 -I$prefix/include benchmarks/lf_cuda_foreign.c -L$prefix/lib -llava_flow -ldl -Wl,-rpath,$prefix/lib -o /tmp/lf_cuda_foreign >> $res/nvcc.txt 2>&1 || cat $res/nvcc.txt
# A lava-flow GPU buffer from a producer on GPU 0 (Vulkan only) to a consumer on GPU 1 by the
# cuda_ipc route with peer access, beside cuMemcpyPeer and the staged route in the same run.
cc -O2 -I$prefix/include benchmarks/lf_cuda_peer.c -L$prefix/lib -llava_flow -ldl -Wl,-rpath,$prefix/lib -o /tmp/lf_cuda_peer >> $res/nvcc.txt 2>&1 || cat $res/nvcc.txt
gpus=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')
if [ -z "${SKIP_BENCH:-}" ]; then
  TAIL=30 run lf-bench-gpu timeout 240 .device/lf-bench --gpu
  TAIL=2 run cuda-ipc timeout 120 /tmp/cuda_ipc_pingpong
  grep -E "^JSON" $res/cuda-ipc.txt | grep -E '"handoff"|"gpu_pingpong"|"open_cost"|"copy"' | head -20
  TAIL=2 run lf-cuda-foreign timeout 150 /tmp/lf_cuda_foreign
  grep -E "^JSON" $res/lf-cuda-foreign.txt | grep -E '"ratio"|_handoff"|_first"' | head -30
  TAIL=2 run lf-cuda timeout 150 /tmp/lf_cuda_pingpong
  grep -E "^JSON|^channel" $res/lf-cuda.txt | head -14
  if [ "$gpus" -ge 2 ]; then  # two GPUs
    TAIL=10 run lf-cuda-peer timeout 300 /tmp/lf_cuda_peer
    grep -E "^JSON" $res/lf-cuda-peer.txt | head -12
  fi
  if [ -n "$have_wheel" ]; then
    TAIL=12 run python-gpu-handoff env PYTHONPATH=/tmp/lfpy timeout 500 python3 benchmarks/python_gpu_handoff.py --c-binary /tmp/lf_cuda_pingpong
    grep -E '^JSON.*"(py_handoff|py_torch_op|tmp_handoff|py_vs_c)"' $res/python-gpu-handoff.txt | head -16
  fi
  echo "== with the MPS daemon"
  mkdir -p /tmp/mps /tmp/mpslog
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
  nvidia-cuda-mps-control -d && sleep 1
  TAIL=2 run cuda-ipc-mps timeout 120 /tmp/cuda_ipc_pingpong
  grep -E "^JSON" $res/cuda-ipc-mps.txt | grep -E '"handoff"|"gpu_pingpong"' | head -12
  TAIL=2 run lf-cuda-foreign-mps timeout 150 /tmp/lf_cuda_foreign
  grep -E "^JSON" $res/lf-cuda-foreign-mps.txt | grep -E '"ratio"|_handoff"|_first"' | head -30
  TAIL=2 run lf-cuda-mps timeout 150 /tmp/lf_cuda_pingpong
  grep -E "^JSON" $res/lf-cuda-mps.txt | head -14
  if [ -n "$have_wheel" ]; then
    TAIL=12 run python-gpu-handoff-mps env PYTHONPATH=/tmp/lfpy timeout 500 python3 benchmarks/python_gpu_handoff.py --c-binary /tmp/lf_cuda_pingpong
  fi
  TAIL=6 run cuda-consumer-mps env LD_LIBRARY_PATH=$PWD/.device/prefix/lib timeout 120 /tmp/bc/lf_cuda_consumer
  echo quit | nvidia-cuda-mps-control
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  TAIL=14 run lf-bench-quick timeout 150 .device/lf-bench --quick --modes busy,block
  # What two one-way channels cost beside the spinning floor on this host with nothing of
  # lava-flow in them: a ring in several layouts, two fixed lines, a ring whose sender waits for
  # the release, and each case's tail (benchmarks/ring_layout.c).
  cc -O2 -o /tmp/ring_layout benchmarks/ring_layout.c && TAIL=2 run ring-layout timeout 120 /tmp/ring_layout 0 1 7
  # Channels over MPI between two ranks that lava-flow sees on two hosts, beside raw MPI
  # (.device/lf-bench-mpi: lf-bench built with the mpi feature, when carried).
  if [ -x .device/lf-bench-mpi ] && command -v mpirun > /dev/null; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    pair="-np 1 -x LF_HOST_ID=a .device/lf-bench-mpi --mpi : -np 1 -x LF_HOST_ID=b .device/lf-bench-mpi --mpi"
    TAIL=14 run lf-bench-mpi-vader timeout 120 mpirun --oversubscribe --mca btl self,vader $pair
    TAIL=14 run lf-bench-mpi-tcp timeout 120 mpirun --oversubscribe --mca btl self,tcp --mca btl_tcp_if_include lo $pair
  fi
  # Host transfers, staged and direct; with a build from before a change when one is carried
  # (.device/lf-gpu-bench-before), alternated with it in the same run.
  for round in 1 2; do
    TAIL=12 run lf-gpu-bench-$round timeout 200 .device/lf-gpu-bench --quick --max-size 256M
    if [ -x .device/lf-gpu-bench-before ]; then
      TAIL=12 run lf-gpu-bench-before-$round timeout 200 .device/lf-gpu-bench-before --quick --max-size 256M
    fi
  done
fi
tar -czf $OUT/results.tar.gz -C /tmp lf-results
