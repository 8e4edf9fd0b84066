#!/usr/bin/env bash
# Batch 8: the platform layer on Linux: lf-bench of the tree before it (8afe769) and after,
# alternated in one run; layer1/layer2 and the C GPU tests on the H200; Python's GPU tests.
for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null 2>&1; done; ldconfig
export XDG_RUNTIME_DIR=/tmp PATH=/usr/local/cuda/bin:$PATH
[ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] && export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
D=$PWD/.device; R=$OUT/r; mkdir -p $R
s() { local n=$1; shift; local t0=$(date +%s); "$@" > $R/$n.txt 2>&1; echo "== $n rc=$? $(( $(date +%s)-t0 ))s"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; lscpu | grep "Model name"; cat $D/commit.txt; } > $R/machine.txt 2>&1
cat $R/machine.txt
s layer1 env LF_REQUIRE_VULKAN=1 LF_REQUIRE_CUDA=1 timeout 300 $D/rt/layer1 --test-threads=2
grep -E "test result|FAILED|panicked" $R/layer1.txt | head -8
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
tar -C $OUT -czf $OUT/results.tgz r
