#!/usr/bin/env bash
for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null 2>&1; done; ldconfig
export XDG_RUNTIME_DIR=/tmp PATH=/usr/local/cuda/bin:$PATH
[ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] && export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
D=$PWD/.device; R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --target /tmp/lfpy $D/lava_flow-*.whl $D/py/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/lfpy
cp $D/v/test_diag_ordered.py crates/python/tests/
LF_LOG_LEVEL=debug timeout 200 python3 -m pytest -v -s -rs -p no:cacheprovider crates/python/tests/test_diag_ordered.py -k "stream_ordered and default" > $R/diag.txt 2>&1
echo rc $?
grep -vE "^\s*$" $R/diag.txt | grep -iE "consumer|release|complet|Thread|File|lava_flow|Error|PASS|FAIL|timed" | cut -c1-250 | head -80
tar -C $OUT -czf $OUT/results.tgz r
