#!/bin/bash
# The H200 run of gpu_memory_given_back (from the repository root on the device host).
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } > $OUT/machine.txt 2>&1
gcc -O2 benchmarks/gpu_memory_given_back.c -Iinclude -L.device/lib -llava_flow -o /tmp/gmgb
LD_LIBRARY_PATH=.device/lib /tmp/gmgb > $OUT/gpu_memory_given_back.txt 2>&1
cat $OUT/machine.txt $OUT/gpu_memory_given_back.txt
