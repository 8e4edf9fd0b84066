#!/usr/bin/env bash
# Batch 6: Python's GPU tests (the stream-ordered tensor test after its allocator warm-up), the
# GPU ping-pong with work and Python's hand-off beside the C path under MPS, and the hand-off's
# breakdown (where Python's time goes).
for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null 2>&1; done; ldconfig
export XDG_RUNTIME_DIR=/tmp PATH=/usr/local/cuda/bin:$PATH
[ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] && export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
D=$PWD/.device; R=$OUT/r; mkdir -p $R
s() { local n=$1; shift; local t0=$(date +%s); "$@" > $R/$n.txt 2>&1; echo "== $n rc=$? $(( $(date +%s)-t0 ))s"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/lfpy $D/lava_flow-*.whl $D/py/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/lfpy
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; cat $D/commit.txt;
  python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, torch.version.cuda)"; } > $R/machine.txt 2>&1
cat $R/machine.txt
s pytest-gpu timeout 400 python3 -m pytest -q -rs -p no:cacheprovider crates/python/tests/test_cuda_tensor.py crates/python/tests/test_gpu.py crates/python/tests/test_fan_gpu.py crates/python/tests/test_torch_pool.py
tail -4 $R/pytest-gpu.txt; grep -E "^(FAILED|ERROR)" $R/pytest-gpu.txt | head
s pytest-ordered timeout 200 python3 -m pytest -v -rs -p no:cacheprovider crates/python/tests/test_cuda_tensor.py -k stream_ordered
grep -E "PASSED|FAILED|SKIPPED|Error|assert" $R/pytest-ordered.txt | head -12
mkdir -p /tmp/inc && cp include/lava_flow.h /tmp/inc/
nvcc -O2 -o /tmp/cuda_ipc_pingpong benchmarks/cuda_ipc_pingpong.cu > $R/nvcc.txt 2>&1 || tail -5 $R/nvcc.txt
nvcc -O2 -I/tmp/inc -L$D/so -Xlinker -rpath=$D/so -l:liblava_flow.so.0.1 -o /tmp/lf_cuda_pingpong benchmarks/lf_cuda_pingpong.cu >> $R/nvcc.txt 2>&1 || tail -5 $R/nvcc.txt
mkdir -p /tmp/mps /tmp/mpslog; export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
nvidia-cuda-mps-control -d && sleep 1
for r in 1 2 3; do
  s lf-cuda-mps-$r timeout 150 /tmp/lf_cuda_pingpong --quick --sizes 4096,65536
  grep -E '"lf_gpu_pingpong"|"lf_handoff"|ratio' $R/lf-cuda-mps-$r.txt | cut -c1-170
done
for r in 1 2 3; do
  s handoff-mps-$r timeout 240 python3 benchmarks/python_gpu_handoff.py --quick --sizes 4096,65536 --no-tmp --c-binary /tmp/lf_cuda_pingpong
  grep -E '"py_vs_c"|py_releases' $R/handoff-mps-$r.txt | cut -c1-170
done
s breakdown-mps timeout 200 python3 benchmarks/python_gpu_handoff.py --breakdown --sizes 65536
tail -30 $R/breakdown-mps.txt
echo quit | nvidia-cuda-mps-control
tar -C $OUT -czf $OUT/results.tgz r
