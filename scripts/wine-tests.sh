#!/usr/bin/env bash
# Builds Rust test executables for x86_64-pc-windows-gnu and runs them under Wine, each with a
# timeout, in a private Wine prefix, and prints a pass/fail summary (exit status 1 if any
# failed or timed out).
#
#   scripts/wine-tests.sh [BUILD SELECTION...] [--timeout S] [-- TEST ARGS...]
#   scripts/wine-tests.sh --run EXE... [--timeout S] [-- TEST ARGS...]
#
# BUILD SELECTION is passed to `cargo test --no-run`: -p/--package P, --test T, --lib, --tests,
# --features F, --no-default-features, --all-features, --manifest-path M (e.g.
# `-p lava-flow --lib`, or `-p lava-flow --test layer2`). Without one, the package in the
# current directory. `--run` skips the build and runs the given .exe files. TEST ARGS go to
# every executable (a filter, `--test-threads=1`, ...).
#
# The build uses Debian's rustc-web (/usr/bin/rustc, with rust-web-src) to build std for the
# target (-Zbuild-std, through RUSTC_BOOTSTRAP), mingw-w64's gcc as the linker, and
# target/wine as its target dir so that the std build is kept. Needs: wine64 (8.0 works),
# rustc-web rust-web-src, gcc-mingw-w64-x86-64.
#
# Environment: WINE (the wine64 loader), WINE_TESTS_PREFIX (the prefix; default one per user
# under /tmp, made on first use), WINE_TESTS_TIMEOUT (seconds per executable, default 600),
# RUSTC_FOR_WINDOWS (default /usr/bin/rustc), CARGO_TARGET_DIR (default target/wine).
#
# Wine 8.0 lacks bcryptprimitives.dll, whose ProcessPrng every Rust program since 1.78 imports
# for its random seeds (HashMap). The script builds a stand-in from RtlGenRandom with mingw and
# puts it in the prefix's system32; on Windows itself nothing of this is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

target=x86_64-pc-windows-gnu
timeout_s=${WINE_TESTS_TIMEOUT:-600}
run_only=0
exes=()
build_args=()
test_args=()

while (($#)); do
  case $1 in
    --run) run_only=1; shift ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --timeout=*) timeout_s=${1#*=}; shift ;;
    --) shift; test_args=("$@"); break ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -p|--package|--test|--features|-F|--manifest-path|--bin|--example|-j|--jobs|--target-dir|--profile)
      build_args+=("$1" "$2"); shift 2 ;;
    -*) build_args+=("$1"); shift ;;
    *)
      if ((run_only)); then exes+=("$1"); shift
      else echo "wine-tests.sh: unexpected argument $1 (executables go after --run)" >&2; exit 2; fi ;;
  esac
done

wine=${WINE:-}
if [[ -z $wine ]]; then
  for candidate in /usr/lib/wine/wine64 "$(command -v wine64 || true)" "$(command -v wine || true)"; do
    if [[ -n $candidate && -x $candidate ]]; then wine=$candidate; break; fi
  done
fi
[[ -n $wine ]] || { echo "wine-tests.sh: no wine64 found: install wine64 (Debian: apt-get install wine64) or set WINE" >&2; exit 2; }
wineserver=$(dirname "$wine")/wineserver
[[ -x $wineserver ]] || wineserver=$(command -v wineserver || echo wineserver)
mingw_gcc=x86_64-w64-mingw32-gcc
command -v $mingw_gcc >/dev/null || { echo "wine-tests.sh: $mingw_gcc missing: install gcc-mingw-w64-x86-64" >&2; exit 2; }

if ((!run_only)); then
  rustc_win=${RUSTC_FOR_WINDOWS:-/usr/bin/rustc}
  [[ -x $rustc_win && -d /usr/lib/rustlib/src/rust/library ]] || {
    echo "wine-tests.sh: $rustc_win with its library sources is needed to build std for $target:" \
      "install rustc-web and rust-web-src, or set RUSTC_FOR_WINDOWS" >&2
    exit 2
  }
  export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target/wine}
  echo "=== building the test executables for $target (${build_args[*]:-the current package})"
  json=$(mktemp)
  trap 'rm -f "$json"' EXIT
  RUSTC=$rustc_win RUSTC_BOOTSTRAP=1 CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER=$mingw_gcc \
    cargo test -Zbuild-std=std,panic_unwind,test --target $target --no-run --message-format=json-render-diagnostics \
    "${build_args[@]}" >"$json" || { echo "wine-tests.sh: the build for $target failed (errors above)" >&2; exit 1; }
  mapfile -t exes < <(python3 -c '
import json, sys
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["executable"])
' "$json")
fi
((${#exes[@]})) || { echo "wine-tests.sh: no test executables to run" >&2; exit 2; }

# The private prefix, made once; the ProcessPrng stand-in put in place.
prefix=${WINE_TESTS_PREFIX:-/tmp/lava-flow-wine-$(id -un)}
export WINEPREFIX=$prefix WINEDEBUG=${WINEDEBUG:--all} WINEDLLOVERRIDES=${WINEDLLOVERRIDES:-"mscoree,mshtml="}
if [[ ! -f $prefix/system.reg ]]; then
  echo "=== making the Wine prefix $prefix"
  timeout 300 "$wine" wineboot -i >/dev/null 2>&1 || true
  # The registry files are written when the prefix's server exits.
  timeout 120 "$wineserver" -w 2>/dev/null || true
  [[ -f $prefix/system.reg ]] || { echo "wine-tests.sh: wineboot could not make $prefix" >&2; exit 2; }
fi
stand_in=$prefix/drive_c/windows/system32/bcryptprimitives.dll
if [[ ! -f $stand_in ]]; then
  src=$(mktemp -d)
  cat >"$src/bcryptprimitives.c" <<'EOF'
/* ProcessPrng, which Rust's std imports and Wine 8.0 lacks, from RtlGenRandom. */
#include <windows.h>
#include <ntsecapi.h>
__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
    while (len) {
        ULONG n = len > 0x10000000 ? 0x10000000 : (ULONG)len;
        if (!RtlGenRandom(data, n)) return FALSE;
        data += n;
        len -= n;
    }
    return TRUE;
}
EOF
  $mingw_gcc -O2 -shared -Wl,--kill-at -o "$stand_in" "$src/bcryptprimitives.c" -ladvapi32
  rm -rf "$src"
fi

results=()
failed=0
logdir=$(mktemp -d "${TMPDIR:-/tmp}/wine-tests.XXXXXX")
for exe in "${exes[@]}"; do
  name=$(basename "$exe")
  log=$logdir/$name.log
  echo "=== $name ${test_args[*]:-}"
  set +e
  timeout --kill-after=10 "$timeout_s" "$wine" "$exe" "${test_args[@]}" 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  set -e
  # The harness prints one "test result:" line per process, children included; the last is
  # the parent's.
  counts=$(grep -a '^test result:' "$log" | tail -1 | sed 's/^test result: //; s/; finished.*//' || true)
  if ((status == 124 || status == 137)); then
    verdict="TIMEOUT after ${timeout_s}s"
    counts=${counts:+"(last result seen, maybe a child's: $counts)"}
  elif ((status == 0)) && [[ $counts == ok.* ]]; then
    verdict="pass"
  elif ((status == 0)); then
    # Seen once: Wine gave back 0 for a run whose tests had printed FAILED.
    verdict="FAIL (exit 0, but the last result is not ok)"
  else
    verdict="FAIL (exit $status)"
  fi
  [[ $verdict == pass ]] || failed=1
  results+=("$(printf '%-20s %s  %s' "$verdict" "$name" "${counts:-no test result line}")")
done
# Wine's server for this prefix, and anything a test left running in it.
"$wineserver" -k 2>/dev/null || true

echo
echo "=== summary (Wine: $("$wine" --version 2>/dev/null || echo "$wine"); logs in $logdir)"
printf '%s\n' "${results[@]}"
exit $failed
