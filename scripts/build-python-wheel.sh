#!/usr/bin/env bash
# Builds the manylinux wheel of the Python package lava_flow (one abi3 wheel for CPython 3.11
# and later) inside the PyPA manylinux_2_28 image, where glibc is old enough for the wheel to
# install on any Linux of the last years; the wheel lands in dist/.
#   scripts/build-python-wheel.sh            # needs docker (or podman: DOCKER=podman)
#   scripts/build-python-wheel.sh --local    # on this machine: a linux_x86_64 wheel for here
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
mkdir -p dist
if [[ ${1:-} == --local ]]; then
  python3 -m pip wheel --no-deps -w dist ./crates/python
  exit
fi
docker=${DOCKER:-docker}
image=${LF_MANYLINUX_IMAGE:-quay.io/pypa/manylinux_2_28_x86_64}
# In the image: Rust (rustup), libclang for the header's bindings, then pip wheel with the
# image's CPython 3.11 and auditwheel, which checks the wheel against manylinux_2_28 (the
# extension and the liblava_flow.so it ships) and tags it.
"$docker" run --rm -v "$root:/io" -w /io "$image" bash -euo pipefail -c '
  dnf install -y -q clang-devel >/dev/null
  curl -sSf https://sh.rustup.rs | sh -s -- -y -q --profile minimal >/dev/null
  export PATH=$HOME/.cargo/bin:$PATH CARGO_TARGET_DIR=/tmp/target
  /opt/python/cp311-cp311/bin/python -m pip wheel --no-deps -w /tmp/wheel ./crates/python
  auditwheel repair --plat manylinux_2_28_x86_64 -w /io/dist /tmp/wheel/lava_flow-*.whl
  chown -R '"$(id -u):$(id -g)"' /io/dist
'
ls -l dist/lava_flow-*manylinux*.whl
