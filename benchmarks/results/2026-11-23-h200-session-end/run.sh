#!/bin/bash
# End of session: Layer 1 (CUDA required) and Layer 2 on the H200 host, the host transfers of
# lf-gpu-bench (the copy crew now lives in the OS layer), and the C API rows beside iceoryx2.
set -u
for f in .gl/*.deb; do dpkg -x $f / >/dev/null 2>&1; done; ldconfig
export XDG_RUNTIME_DIR=/tmp VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
O=$OUT; d=.device/final
{ date -u; uname -r; nproc; lscpu | sed -n 's/^Model name: *//p'; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $O/machine.txt 2>&1
env LF_REQUIRE_VULKAN=1 LF_REQUIRE_CUDA=1 timeout 200 $d/layer1 --test-threads=4 > $O/layer1.txt 2>&1; echo "layer1 rc=$?" >> $O/layer1.txt
LF_TEST_TIMEOUT=60 timeout 200 $d/layer2 > $O/layer2.txt 2>&1; echo "layer2 rc=$?" >> $O/layer2.txt
timeout 60 $d/lf-gpu-bench --only host > $O/gpu-host.txt 2>&1; echo "gpu rc=$?" >> $O/gpu-host.txt
timeout 240 $d/lf-bench --modes capi --iceoryx2 $d/iceoryx2-pingpong > $O/lf-bench.txt 2>&1; echo "bench rc=$?" >> $O/lf-bench.txt
tail -2 $O/layer1.txt $O/layer2.txt; grep -E "write from a Vec|read into a Vec" $O/gpu-host.txt; sed -n '/Targets/,$p' $O/lf-bench.txt | cut -c1-200
