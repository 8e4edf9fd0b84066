#!/bin/sh
# Runs a two-process test as two executables: `CONSUMER consumer NAME` in the background and
# `PRODUCER producer NAME`, with a private runtime dir that must be empty afterwards.
#   run_pair.sh PRODUCER CONSUMER
producer=$1 consumer=$2
dir=$(mktemp -d)
name="pair-$$"
LF_RUNTIME_DIR=$dir "$consumer" consumer "$name" & cpid=$!
LF_RUNTIME_DIR=$dir "$producer" producer "$name"; prc=$?
wait $cpid; crc=$?
left=$(ls -A "$dir")
rm -rf "$dir"
if [ $prc -ne 0 ] || [ $crc -ne 0 ] || [ -n "$left" ]; then
  echo "FAILED (producer exit $prc, consumer exit $crc, left in the runtime dir: ${left:-nothing})" >&2
  exit 1
fi
echo "pair passed"
