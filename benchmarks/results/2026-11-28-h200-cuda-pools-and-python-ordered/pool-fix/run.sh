#!/usr/bin/env bash
for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null 2>&1; done; ldconfig
export XDG_RUNTIME_DIR=/tmp PATH=/usr/local/cuda/bin:$PATH
[ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] && export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
D=$PWD/.device; R=$OUT/r; mkdir -p $R
env LF_REQUIRE_VULKAN=1 timeout 60 $D/rt/layer2 --test-threads=1 cuda_ipc:: > $R/layer2-cuda.txt 2>&1; echo "layer2 cuda rc=$?"
grep -E "test result|FAILED|panicked at" $R/layer2-cuda.txt | head -6
cc -O2 -Iinclude benchmarks/lf_cuda_foreign.c -L$D/so -l:liblava_flow.so.0.1 -ldl -Wl,-rpath,$D/so -o /tmp/lf_cuda_foreign > $R/cc.txt 2>&1 || tail -3 $R/cc.txt
mkdir -p /tmp/mps /tmp/mpslog; export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
nvidia-cuda-mps-control -d && sleep 1
timeout 90 /tmp/lf_cuda_foreign --quick --sizes 4096,1048576 > $R/foreign-mps.txt 2>&1; echo "foreign rc=$?"
grep -vE "^JSON|^channel|^CUDA memory" $R/foreign-mps.txt | tail -24
echo quit | nvidia-cuda-mps-control; unset CUDA_MPS_PIPE_DIRECTORY
python3 -m pip install -q --no-index --no-deps --target /tmp/lfpy $D/lava_flow-*.whl $D/py/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/lfpy LF_LOG_LEVEL=debug timeout 75 python3 -m pytest -q -x -s -p no:cacheprovider crates/python/tests/test_cuda_tensor.py -k "stream_ordered and default" > $R/t.txt 2>&1; echo "pytest rc=$?"; tail -1 $R/t.txt
tar -C $OUT -czf $OUT/results.tgz r
