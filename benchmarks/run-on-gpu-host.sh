#!/bin/bash
# Runs lava-flow's GPU tests, the CUDA example and the GPU benchmarks on a machine with an
# NVIDIA GPU but no Rust toolchain; writes logs to $OUT. Prepare, on the build machine:
#   .device/layer1, .device/layer2   cargo test --test layer1 (layer2) --no-run   (the binaries it names)
#   .device/libtests        cargo test --lib --no-run
#   .device/lf-gpu-bench, .device/lf-bench (.device/lf-alloc-bench optional)   cargo build --release --bin ...
#   .device/prefix          cmake --install of the release build
#   .gl/*.deb               the Vulkan loader packages (libvulkan1 etc.), when the host lacks one
# Set SKIP_BENCH=1 to run only the tests and the example.
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
if [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
export XDG_RUNTIME_DIR=/tmp
{ date -u; uname -r; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc; } 2>&1 | tee $OUT/machine.txt
echo "== layer1 tests (GPU required)"
LF_REQUIRE_VULKAN=1 LF_REQUIRE_CUDA=1 timeout 300 .device/layer1 --test-threads=1 2>&1 | tee $OUT/layer1-tests.txt | tail -40
echo "== lib unit tests"
LF_REQUIRE_VULKAN=1 timeout 120 .device/libtests --test-threads=1 2>&1 | tee $OUT/lib-tests.txt | tail -5
echo "== layer2 channel tests"
timeout 200 .device/layer2 --test-threads=2 2>&1 | tee $OUT/layer2-tests.txt | tail -5
echo "== CUDA and OpenCL examples against the installed prefix"
export PATH=/usr/local/cuda/bin:$PATH
(cmake -S examples-cpp -B /tmp/bc -DCMAKE_PREFIX_PATH=$PWD/.device/prefix && cmake --build /tmp/bc -j8 && LD_LIBRARY_PATH=$PWD/.device/prefix/lib ctest --test-dir /tmp/bc --output-on-failure -V) 2>&1 | tee $OUT/cuda-example.txt | tail -12
(ls /etc/OpenCL/vendors/ 2>&1; cmake -S examples-c -B /tmp/bcl "-DCMAKE_PREFIX_PATH=$PWD/.device/prefix;/usr/local/cuda" && cmake --build /tmp/bcl -j8 && LD_LIBRARY_PATH=$PWD/.device/prefix/lib ctest --test-dir /tmp/bcl --output-on-failure -V) 2>&1 | tee $OUT/c-examples.txt | tail -40
echo "== lf-bench --quick (a 16-core host; the targets are for the 2-core CI machine)"
timeout 120 .device/lf-bench --quick 2>&1 | tee $OUT/lf-bench-quick.txt | tail -25
if [ -z "${SKIP_BENCH:-}" ]; then
echo "== lf-gpu-bench"
timeout 200 .device/lf-gpu-bench 2>&1 | tee $OUT/gpu-bench.txt
timeout 120 .device/lf-gpu-bench --json > $OUT/gpu-bench.json 2>$OUT/gpu-bench.err
echo "== lf-alloc-bench"
if [ -x .device/lf-alloc-bench ]; then timeout 60 .device/lf-alloc-bench 2>&1 | tee $OUT/alloc-bench.txt; fi
fi
