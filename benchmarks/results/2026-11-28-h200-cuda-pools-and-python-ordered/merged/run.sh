#!/usr/bin/env bash
# Batch 2: the merged tree (IPC pools, VMM spans, torch pools): layer1/layer2 on the H200, the
# C CUDA and GPU channel tests, Python's GPU tests, lf_cuda_foreign with pool memory, and
# Python's hand-off with stream-ordered sends beside the C path, MPS off and on.
for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null 2>&1; done; ldconfig
export XDG_RUNTIME_DIR=/tmp PATH=/usr/local/cuda/bin:$PATH
[ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] && export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
D=$PWD/.device; R=$OUT/r; mkdir -p $R
s() { local n=$1; shift; local t0=$(date +%s); "$@" > $R/$n.txt 2>&1; echo "== $n rc=$? $(( $(date +%s)-t0 ))s"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; cat $D/commit.txt; } > $R/machine.txt 2>&1
s layer1 env LF_REQUIRE_VULKAN=1 LF_REQUIRE_CUDA=1 timeout 300 $D/rt/layer1 --test-threads=2
grep -E "test result|FAILED|panicked" $R/layer1.txt | head -8
s layer1-cuda env LF_REQUIRE_CUDA=1 timeout 120 $D/rt/layer1 --nocapture --test-threads=1 cuda_memory::
grep -E "^test |test result|skipped" $R/layer1-cuda.txt | head -14
s layer2-cuda env LF_REQUIRE_VULKAN=1 timeout 300 $D/rt/layer2 --test-threads=1 --nocapture cuda_ipc:: gpu_release::
grep -E "^test |test result|FAILED|panicked|skipped" $R/layer2-cuda.txt | head -30
s layer2 env LF_REQUIRE_VULKAN=1 timeout 420 $D/rt/layer2 --test-threads=2
grep -E "test result|FAILED|panicked" $R/layer2.txt | head -10
mkdir -p /tmp/inc && cp include/lava_flow.h /tmp/inc/
for t in test_cuda_channel test_gpu_channel; do
  gcc -std=c11 -D_GNU_SOURCE -I/tmp/inc -Itests/c tests/c/$t.c -L$D/so -l:liblava_flow.so.0.1 -ldl -o /tmp/$t >> $R/cc.txt 2>&1 || tail -5 $R/cc.txt
  s c-$t env LD_LIBRARY_PATH=$D/so LF_REQUIRE_VULKAN=1 timeout 90 /tmp/$t; grep -vE "^(producer|consumer): transport" $R/c-$t.txt | tail -2
done
python3 -m pip install -q --no-index --no-deps --target /tmp/lfpy $D/lava_flow-*.whl $D/py/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/lfpy
s pytest-gpu timeout 400 python3 -m pytest -q -rs -p no:cacheprovider crates/python/tests/test_cuda_tensor.py crates/python/tests/test_gpu.py crates/python/tests/test_fan_gpu.py crates/python/tests/test_torch_pool.py
tail -4 $R/pytest-gpu.txt; grep -E "^(FAILED|ERROR)" $R/pytest-gpu.txt | head
cc -O2 -Iinclude benchmarks/lf_cuda_foreign.c -L$D/so -l:liblava_flow.so.0.1 -ldl -Wl,-rpath,$D/so -o /tmp/lf_cuda_foreign > $R/cc-foreign.txt 2>&1 || tail -5 $R/cc-foreign.txt
nvcc -O2 -I/tmp/inc -L$D/so -Xlinker -rpath=$D/so -l:liblava_flow.so.0.1 -o /tmp/lf_cuda_pingpong benchmarks/lf_cuda_pingpong.cu > $R/nvcc.txt 2>&1 || tail -5 $R/nvcc.txt
s handoff-nomps timeout 240 python3 benchmarks/python_gpu_handoff.py --quick --sizes 4096,65536 --no-tmp --c-binary /tmp/lf_cuda_pingpong
grep -E '"py_vs_c"' $R/handoff-nomps.txt | cut -c1-170
mkdir -p /tmp/mps /tmp/mpslog; export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
nvidia-cuda-mps-control -d && sleep 1
s foreign-mps timeout 240 /tmp/lf_cuda_foreign --quick --sizes 4096,1048576
grep -E "handoff|first|ratio" $R/foreign-mps.txt | grep -v JSON | head -20
for r in 1 2; do
  s handoff-mps-$r timeout 240 python3 benchmarks/python_gpu_handoff.py --quick --sizes 4096,65536 --no-tmp --c-binary /tmp/lf_cuda_pingpong
  grep -E '"py_vs_c"|py_releases' $R/handoff-mps-$r.txt | cut -c1-170
done
echo quit | nvidia-cuda-mps-control
tar -C $OUT -czf $OUT/results.tgz r
