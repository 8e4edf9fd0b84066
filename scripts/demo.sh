#!/usr/bin/env bash
# The README's first command: installs what is missing, builds and installs lava-flow into
# ./build/demo/prefix, builds the examples against that installed package (as a user would),
# and runs them: where this process runs, then two processes exchanging messages through a
# channel (a C producer and a C consumer, separate executables).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=$root/build/demo
prefix=$build/prefix

scripts/install-deps.sh demo
export PATH="$HOME/.cargo/bin:$PATH"

echo "== building and installing lava-flow into $prefix"
cmake -S . -B "$build/lib" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" \
      -DBUILD_TESTING=OFF -DLAVA_FLOW_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$build/lib" -j"$(nproc)"
cmake --install "$build/lib" >/dev/null

echo "== building the examples against the installed package"
for ex in examples-c examples-cpp; do
  cmake -S "$ex" -B "$build/$ex" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
  cmake --build "$build/$ex" -j"$(nproc)" >/dev/null
done

# A config describing one process on this host and one elsewhere.
config=$build/processes.json
cat > "$config" <<JSON
{
  "processes": [
    { "name": "neighbour", "hostname": "$(hostname)", "node_id": 0 },
    { "name": "far-away", "hostname": "gpu-node-1", "device_id": 0 }
  ]
}
JSON

echo
echo "== C example: this process's location and its scope to the processes in $config"
"$build/examples-c/lf_location_c" "$config" neighbour far-away
echo
echo "== two processes, one channel: examples-c/channel_producer.c and channel_consumer.c"
sh examples-c/run_channel_demo.sh "$build/examples-c/lf_channel_producer" "$build/examples-c/lf_channel_consumer"
