#!/usr/bin/env bash
# Checks that the core and the C API compile, warning-free, for the platforms this machine
# does not run: Windows (GNU and MSVC ABIs) and macOS (Intel and Apple silicon). `cargo check`
# only: nothing is linked or run, so what it proves is that the code compiles there.
#
# Each target's standard library is built from source (-Zbuild-std) by Debian's rustc-web with
# its sources (rust-web-src), which scripts/install-deps.sh installs; this script installs
# nothing. Everything is cached in target/cross (the first build of a target's std takes a
# couple of minutes), away from the normal build.
#
#   scripts/check-targets.sh                      the four targets
#   scripts/check-targets.sh x86_64-apple-darwin  only those named
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

rustc=${LF_CROSS_RUSTC:-/usr/bin/rustc}
if [[ ! -x $rustc ]] || ! "$rustc" --print sysroot >/dev/null 2>&1; then
  echo "check-targets: no $rustc: install rustc-web and rust-web-src (scripts/install-deps.sh), or point LF_CROSS_RUSTC at a rustc with its std sources" >&2
  exit 1
fi
if [[ ! -d $("$rustc" --print sysroot)/lib/rustlib/src/rust/library ]]; then
  echo "check-targets: $rustc has no std sources to build for other targets: install rust-web-src" >&2
  exit 1
fi

targets=("$@")
((${#targets[@]})) || targets=(x86_64-pc-windows-gnu x86_64-pc-windows-msvc x86_64-apple-darwin aarch64-apple-darwin)

failed=()
for target in "${targets[@]}"; do
  start=$SECONDS
  # -D warnings: code that only one platform compiles (an unused import, dead code) fails too.
  # Each entry of `checks` is one cargo check of the core and the C API, with these arguments
  # added. Windows also without default features: memory (and the C API's memory functions) is
  # built there only without the vulkan feature so far. The Macs with lf-info, whose tools the
  # platform table promises (lf-bench is Linux's).
  checks=("")
  [[ $target == *windows* ]] && checks+=("--no-default-features")
  [[ $target == *apple* ]] && checks=("-p lava-flow-tools --lib --bin lf-info")
  ok=1
  for extra in "${checks[@]}"; do
    # shellcheck disable=SC2086 # split on purpose; an empty entry is no argument
    RUSTC=$rustc RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR=target/cross RUSTFLAGS="-D warnings" \
      cargo check --quiet -Zbuild-std=std,panic_abort --target "$target" -p lava-flow -p lava-flow-c-api $extra || ok=0
  done
  if ((ok)); then
    echo "check-targets: $target compiles ($((SECONDS - start)) s)"
  else
    echo "check-targets: $target FAILED ($((SECONDS - start)) s)" >&2
    failed+=("$target")
  fi
done
if ((${#failed[@]})); then
  echo "check-targets: these targets do not compile: ${failed[*]}; rerun scripts/check-targets.sh ${failed[*]} to see why" >&2
  exit 1
fi
