#!/usr/bin/env bash
# Installs the system packages lava-flow needs to build and test (Debian 12 / Ubuntu), only
# those missing. Idempotent; works as root or through sudo. Rust (cargo) must already be there.
set -euo pipefail

packages=(build-essential pkg-config cmake libclang-dev libvulkan-dev mesa-vulkan-drivers
          vulkan-tools libopenmpi-dev openmpi-bin libnuma-dev numactl iproute2 valgrind
          python3 python3-venv python3-pip)

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
