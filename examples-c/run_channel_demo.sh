#!/bin/sh
# Runs the two-process channel demo: the consumer in the background, then the producer, and
# prints what each said.
#   run_channel_demo.sh PRODUCER CONSUMER
producer=$1 consumer=$2
name="demo-$$"
log=$(mktemp -d)
"$consumer" "$name" >"$log/consumer" 2>&1 & cpid=$!
"$producer" "$name" >"$log/producer" 2>&1; prc=$?
wait $cpid; crc=$?
cat "$log/producer" "$log/consumer"
rm -rf "$log"
if [ $prc -ne 0 ] || [ $crc -ne 0 ]; then
  echo "channel demo FAILED (producer exit $prc, consumer exit $crc)" >&2
  exit 1
fi
echo "channel demo passed"
