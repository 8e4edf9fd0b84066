#!/usr/bin/env bash
# Batch 1: lava_flow.torch pools, CuPy, Python GPU tests; Python's GPU hand-off beside the C
# path with MPS off and on; the GPU ping-pong with work; OpenCL's memory extensions.
for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null 2>&1; done; ldconfig
export XDG_RUNTIME_DIR=/tmp PATH=/usr/local/cuda/bin:$PATH
[ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] && export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
D=$PWD/.device; R=$OUT/r; mkdir -p $R
s() { local n=$1; shift; local t0=$(date +%s); "$@" > $R/$n.txt 2>&1; echo "== $n rc=$? $(( $(date +%s)-t0 ))s"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/lfpy $D/lava_flow-*.whl $D/py/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/lfpy
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; cat $D/commit.txt;
  python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, torch.version.cuda)";
  python3 -c "import cupy; print('cupy', cupy.__version__)"; } > $R/machine.txt 2>&1
cat $R/machine.txt
gcc -O2 -o /tmp/clprobe $D/v/clprobe.c -lOpenCL > $R/clprobe-cc.txt 2>&1 || gcc -O2 -I/usr/local/cuda/include -o /tmp/clprobe $D/v/clprobe.c -L/usr/local/cuda/lib64 -lOpenCL >> $R/clprobe-cc.txt 2>&1
s clprobe /tmp/clprobe; grep -E "platform|device|sharing" $R/clprobe.txt | head -8
s pytest-pool timeout 300 python3 -m pytest -v -rs -p no:cacheprovider crates/python/tests/test_torch_pool.py crates/python/tests/test_examples.py -k "torch_pool or pool"
grep -E "passed|failed|PASSED|FAILED|SKIPPED|Error" $R/pytest-pool.txt | tail -25
s pytest-gpu timeout 300 python3 -m pytest -q -rs -p no:cacheprovider crates/python/tests/test_cuda_tensor.py crates/python/tests/test_gpu.py crates/python/tests/test_fan_gpu.py
tail -6 $R/pytest-gpu.txt
s example-pool timeout 120 python3 examples-python/torch_pool.py; tail -5 $R/example-pool.txt
mkdir -p /tmp/inc && cp include/lava_flow.h /tmp/inc/
nvcc -O2 -o /tmp/cuda_ipc_pingpong benchmarks/cuda_ipc_pingpong.cu > $R/nvcc.txt 2>&1 || tail -5 $R/nvcc.txt
nvcc -O2 -I/tmp/inc -L$D/so -Xlinker -rpath=$D/so -l:liblava_flow.so.0.1 -o /tmp/lf_cuda_pingpong benchmarks/lf_cuda_pingpong.cu >> $R/nvcc.txt 2>&1 || tail -5 $R/nvcc.txt
for mode in nomps mps; do
  if [ $mode = mps ]; then
    mkdir -p /tmp/mps /tmp/mpslog; export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
    nvidia-cuda-mps-control -d && sleep 1
    for r in 1 2 3; do
      s cuda-ipc-$mode-$r timeout 150 /tmp/cuda_ipc_pingpong --quick --sizes 4096,65536
      grep -E '"gpu_local"|"gpu_pingpong"' $R/cuda-ipc-$mode-$r.txt | cut -c1-110
      s lf-cuda-$mode-$r timeout 150 /tmp/lf_cuda_pingpong --quick --sizes 4096,65536
      grep -E '"lf_gpu_pingpong"|"lf_handoff"' $R/lf-cuda-$mode-$r.txt | cut -c1-150
    done
  fi
  for r in 1 2; do
    s handoff-$mode-$r timeout 240 python3 benchmarks/python_gpu_handoff.py --quick --sizes 4096,65536 --no-tmp --c-binary /tmp/lf_cuda_pingpong
    grep -E "^JSON" $R/handoff-$mode-$r.txt | cut -c1-150 | head -16
  done
done
echo quit | nvidia-cuda-mps-control
tar -C $OUT -czf $OUT/results.tgz r
