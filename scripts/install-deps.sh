#!/usr/bin/env bash
# Installs the system packages lava-flow needs (Debian 12 / Ubuntu), only those missing.
# Idempotent; works as root or through sudo. Rust (cargo) must already be there.
#
#   scripts/install-deps.sh demo   what the demo uses: a C/C++ toolchain, CMake, pkg-config, and
#                                  the Vulkan loader with Mesa's drivers (lavapipe: Vulkan on the CPU)
#   scripts/install-deps.sh        (or `test`) what the test suite uses besides: Open MPI and
#                                  libclang (the mpi feature and its tests), valgrind, Python's venv
#                                  and pip (the Python package's tests), EGL and Mesa's OpenGL
#                                  drivers (llvmpipe: the OpenGL interop example), and Debian's
#                                  rustc-web with its std sources and the MinGW binutils
#                                  (scripts/check-targets.sh: the Windows and macOS checks), and
#                                  wine64 with MinGW's gcc (scripts/wine-tests.sh: Windows tests)
set -euo pipefail

packages=(build-essential pkg-config cmake libvulkan1 mesa-vulkan-drivers)
case ${1:-test} in
  demo) ;;
  test) packages+=(libclang-dev libopenmpi-dev openmpi-bin valgrind python3 python3-venv python3-pip
                   libegl-dev libegl-mesa0 libgl1-mesa-dri rustc-web rust-web-src binutils-mingw-w64-x86-64
                   gcc-mingw-w64-x86-64 wine64) ;;
  *) echo "install-deps: unknown set '$1' (demo or test)" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  if [[ $(id -u) -eq 0 ]]; then sudo=(); elif command -v sudo >/dev/null; then sudo=(sudo); else
    echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1
  fi
  echo "install-deps: installing ${missing[*]}"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all system packages present"
fi

if ! command -v cargo >/dev/null && [[ -x "$HOME/.cargo/bin/cargo" ]]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null || { echo "install-deps: cargo not found; install Rust (rustup) first" >&2; exit 1; }
