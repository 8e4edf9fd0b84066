#!/usr/bin/env bash
# The whole test suite: the README's test command, and what CI runs (.ci/run).
# Installs missing system packages, then: cargo build + test with all features (the header
# check is one of the tests), the CMake build, ctest, the install, and the package as a user
# sees it (find_package shared and static, pkg-config, the examples built out of tree), and the
# Python package (the manylinux wheel into a venv and pytest; the pip-built one, pytest of MPI).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${LF_BUILD_DIR:-$root/build/test}
prefix=$build/prefix
jobs=$(nproc)

step() { printf '\n=== %s\n' "$*"; }

step "system packages"
scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
# lavapipe and vulkaninfo want a runtime dir; lava-flow's channels put their sockets there.
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}

step "hugepages"
want_hugepages=64
have=$(cat /proc/sys/vm/nr_hugepages 2>/dev/null || echo 0)
if ((have >= want_hugepages)); then
  echo "$have 2 MiB hugepages reserved"
elif [[ -w /proc/sys/vm/nr_hugepages ]] && echo $want_hugepages > /proc/sys/vm/nr_hugepages 2>/dev/null; then
  echo "reserved $(cat /proc/sys/vm/nr_hugepages) 2 MiB hugepages (was $have)"
else
  echo "cannot reserve hugepages (not root?): hugepage tests check the strict-mode error instead"
fi

step "cargo build --all-features"
cargo build --all-features --all-targets

step "cargo fmt --check, cargo clippy -D warnings, the other platforms, rust-version, layering, cargo doc"
if cargo fmt --version >/dev/null 2>&1; then
  cargo fmt --all --check || { echo "the sources are not formatted: run cargo fmt" >&2; exit 1; }
else
  echo "rustfmt is not installed with this toolchain (rustup component add rustfmt): format check skipped"
fi
if cargo clippy --version >/dev/null 2>&1; then
  cargo clippy --all-features --all-targets -- -D warnings
  cargo clippy --no-default-features --all-targets -- -D warnings   # the build without Vulkan
else
  echo "clippy is not installed with this toolchain (rustup component add clippy): lints skipped"
fi
scripts/check-targets.sh   # Windows and macOS: compiled, not run
# Windows, run: the library's unit tests (the platform layer's Windows implementation, CPU
# memory) and layer 1's CPU memory tests, built for x86_64-pc-windows-gnu and run under Wine;
# any failure fails the suite.
wine_start=$SECONDS
scripts/wine-tests.sh -p lava-flow --lib --test layer1 --no-default-features
echo "the Windows tests under Wine took $((SECONDS - wine_start)) s (with their std build when not cached)"
python3 scripts/check-msrv.py
python3 scripts/check-readme.py
python3 scripts/check-layers.py
RUSTDOCFLAGS="-D warnings" cargo doc --all-features --no-deps --quiet

step "cargo package: the core crate as crates.io takes it"
# With lava-flow-cuda, which the core needs and which is not on crates.io yet: cargo packages
# the two together. Without verify (a rebuild of the core from the package, ~1 minute here:
# cargo package -p lava-flow-cuda -p lava-flow --allow-dirty does it).
cargo package -p lava-flow-cuda -p lava-flow --no-verify --allow-dirty --quiet
packaged=$(cargo package -p lava-flow --list --allow-dirty 2>/dev/null)
for f in Cargo.toml README.md LICENSE src/lib.rs src/memory/gpu/shaders/copy_vec4.spv examples/channel.rs; do
  grep -qx "$f" <<<"$packaged" || { echo "the lava-flow package lacks $f: add it to include in Cargo.toml" >&2; exit 1; }
done
if grep -E '^(benchmarks|tests|crates|build|target)/' <<<"$packaged"; then
  echo "the lava-flow package carries the files above, which are not the crate's: narrow include in Cargo.toml" >&2; exit 1
fi
echo "lava-flow packages as $(wc -l <<<"$packaged") files, $(du -h target/package/lava-flow-"$(sed -n 's/^version = "\([0-9.]*\)"/\1/p' Cargo.toml | head -1)".crate | cut -f1) compressed"

step "cargo test --all-features (Rust unit, integration, header-up-to-date)"
cargo test --all-features

step "the Rust example (examples/channel.rs): a producer and a consumer process"
cargo build --all-features --example channel
mkdir -p "$build"
target/debug/examples/channel consumer > "$build/rust-example.out" &
consumer=$!
target/debug/examples/channel producer
wait $consumer
cat "$build/rust-example.out"
[[ $(grep -c '^received "message [0-2]"$' "$build/rust-example.out") == 3 ]] ||
  { echo "the Rust example's consumer did not receive its three messages" >&2; exit 1; }

step "LAVA_FLOW_MPI: the default configure finds MPI; OFF, and AUTO without an MPI, build without; ON without fails"
tests/cmake/check-mpi-option.sh "$build/mpi-option"

step "CMake build"
# As the README says to build: no MPI flag. MPI is installed here, so the default (AUTO) builds
# it in and ctest runs the lf_mpi tests under mpirun (LF_CMAKE_MPI=OFF builds without;
# LF_CMAKE_FEATURES adds cargo features).
mpi_mode=${LF_CMAKE_MPI-AUTO}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" \
  -DLAVA_FLOW_FEATURES="${LF_CMAKE_FEATURES-}" -DLAVA_FLOW_MPI="$mpi_mode"
cargo_features=$(sed -n 's/^LAVA_FLOW_CARGO_FEATURES:INTERNAL=//p' "$build/CMakeCache.txt")
if [[ $mpi_mode != OFF && ,$cargo_features, != *,mpi,* ]]; then
  echo "the CMake build has no MPI although MPI is installed (cargo features: '$cargo_features'): see its 'lava-flow MPI' line above" >&2
  exit 1
fi
cmake --build "$build" -j"$jobs"

step "ctest (C and C++ tests, examples, valgrind)"
ctest --test-dir "$build" --output-on-failure -j"$jobs"

step "install"
rm -rf "$prefix"
cmake --install "$build"

step "versioned shared library: real file, SONAME link, development link"
version=$(sed -n 's/^version = "\([0-9.]*\)"/\1/p' Cargo.toml | head -1)
major=${version%%.*}; minor=${version#*.}; minor=${minor%%.*}
if [[ $major == 0 ]]; then abi=0.$minor; else abi=$major; fi
libdir=$(dirname "$(find "$prefix" -name "liblava_flow.so.$version" -type f)")
[[ -d $libdir ]] || { echo "liblava_flow.so.$version was not installed" >&2; exit 1; }
[[ $(readlink "$libdir/liblava_flow.so.$abi") == "liblava_flow.so.$version" ]] ||
  { echo "liblava_flow.so.$abi does not link to liblava_flow.so.$version" >&2; exit 1; }
[[ $(readlink "$libdir/liblava_flow.so") == "liblava_flow.so.$abi" ]] ||
  { echo "liblava_flow.so does not link to liblava_flow.so.$abi" >&2; exit 1; }
soname=$(readelf -d "$libdir/liblava_flow.so.$version" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[[ $soname == "liblava_flow.so.$abi" ]] || { echo "SONAME is '$soname', expected liblava_flow.so.$abi" >&2; exit 1; }
echo "liblava_flow.so -> liblava_flow.so.$abi (SONAME) -> liblava_flow.so.$version"

step "the installed lf-info"
"$prefix/bin/lf-info" | tee "$build/lf-info.out"
"$prefix/bin/lf-info" -c --json >/dev/null
# It says how the library got MPI: here CMake found it by itself (unless LF_CMAKE_* chose).
if [[ $mpi_mode == AUTO && ,${LF_CMAKE_FEATURES-}, != *,mpi,* ]] &&
  ! grep -q "^mpi: built in (CMake found MPI automatically: " "$build/lf-info.out"; then
  echo "lf-info does not say that CMake built MPI in by itself (its 'mpi:' line above)" >&2; exit 1
fi

step "find_package(LavaFlow) from a project outside the tree: shared, then static"
for mode in OFF ON; do
  cmake -S tests/consumer -B "$build/consumer-$mode" -DCMAKE_PREFIX_PATH="$prefix" -DLINK_STATIC=$mode >/dev/null
  cmake --build "$build/consumer-$mode"
  "$build/consumer-$mode/app"
done
if ldd "$build/consumer-ON/app" | grep -q liblava_flow; then
  echo "the static consumer is linked to liblava_flow.so" >&2; exit 1
fi
if ! readelf -d "$build/consumer-OFF/app" | grep -q "NEEDED.*\[liblava_flow.so.$abi\]"; then
  echo "the shared consumer does not record liblava_flow.so.$abi (the SONAME)" >&2; exit 1
fi

step "pkg-config"
pcdir=$(dirname "$(find "$prefix" -name lava_flow.pc)")
flags=$(PKG_CONFIG_PATH=$pcdir pkg-config --cflags --libs lava_flow)
echo "pkg-config --cflags --libs lava_flow: $flags"
# shellcheck disable=SC2086
cc -std=c11 tests/consumer/main.c $flags -o "$build/pkgconfig-app"
LD_LIBRARY_PATH=$(PKG_CONFIG_PATH=$pcdir pkg-config --variable=libdir lava_flow) "$build/pkgconfig-app"

step "examples built against the installed prefix"
for ex in examples-c examples-cpp; do
  cmake -S "$ex" -B "$build/installed-$ex" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
  cmake --build "$build/installed-$ex" -j"$jobs"
  ctest --test-dir "$build/installed-$ex" --output-on-failure
done

step "Python package: the manylinux wheel (auditwheel, tags checked) into a fresh venv, pytest"
# Built here without a container (scripts/manylinux-wheel.sh), without MPI as published wheels
# are, in the CMake step's cargo directory, so that cargo reuses the library's dependencies.
# The whole suite runs from it (test_mpi.py skips: no MPI in it; the test that the library
# without MPI refuses lf.Mpi runs instead).
python=${LF_PYTHON:-python3}
CARGO_TARGET_DIR="$build/cargo" LF_PYTHON="$python" LF_WHEEL_WORK="$build/manylinux-wheel" \
  scripts/manylinux-wheel.sh "$build/dist"
rm -rf "$build/venv-manylinux"
"$python" -m venv "$build/venv-manylinux"
"$build/venv-manylinux/bin/pip" install -q --upgrade pip
"$build/venv-manylinux/bin/pip" install -q "$(ls "$build"/dist/lava_flow-*-manylinux*.whl)" pytest numpy
(cd "$build" && "$build/venv-manylinux/bin/python" -m pytest -q "$root/crates/python/tests")

step "Python package as a user builds it (pip install ./crates/python, CMake's features), MPI tests"
# pip and maturin through the package's build backend, with the CMake step's cargo features
# (mpi where MPI is installed) and cargo directory, so that cargo reuses its release build of
# the library. Only the MPI tests run from it: the manylinux wheel above ran the rest.
rm -rf "$build/venv"
"$python" -m venv "$build/venv"
"$build/venv/bin/pip" install -q --upgrade pip
CARGO_TARGET_DIR="$build/cargo" LAVA_FLOW_FEATURES="$cargo_features" \
  "$build/venv/bin/pip" install -q "./crates/python[test]"
if [[ ,$cargo_features, == *,mpi,* ]] &&
  ! grep -q "LAVA_FLOW_FEATURE_MPI 1" "$("$build/venv/bin/python" -c 'import lava_flow; print(lava_flow.get_include())')/lava_flow_features.h"; then
  echo "the pip-built lava_flow has no MPI although the CMake features '$cargo_features' have it" >&2; exit 1
fi
(cd "$build" && "$build/venv/bin/python" -m pytest -q "$root/crates/python/tests/test_mpi.py")

step "all tests passed"
