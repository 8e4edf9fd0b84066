#!/bin/sh
# Runs the fan-in example: the consumer in the background, then PRODUCERS producers (4 by
# default), each its own process, and prints what each said.
#   run_fan_in.sh CONSUMER PRODUCER [PRODUCERS [MESSAGES]]
# CONSUMER and PRODUCER are fan_in executables (C or C++, the same or not).
consumer=$1 producer=$2 producers=${3:-4} messages=${4:-100000}
name="fan-in-$$"
log=$(mktemp -d)
"$consumer" consumer "$name" "$producers" "$messages" >"$log/consumer" 2>&1 & cpid=$!
pids=""
i=0
while [ "$i" -lt "$producers" ]; do
  "$producer" producer "$name" "$producers" "$messages" >"$log/producer-$i" 2>&1 & pids="$pids $!"
  i=$((i + 1))
done
failed=0
for p in $pids; do wait "$p" || failed=$((failed + 1)); done
wait $cpid; crc=$?
cat "$log"/producer-* "$log/consumer"
rm -rf "$log"
if [ $failed -ne 0 ] || [ $crc -ne 0 ]; then
  echo "fan-in demo FAILED ($failed of $producers producers failed, consumer exit $crc)" >&2
  exit 1
fi
echo "fan-in demo passed"
