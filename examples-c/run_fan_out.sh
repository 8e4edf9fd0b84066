#!/bin/sh
# Runs the fan-out example: the producer in the background, then CONSUMERS consumers (4 by
# default), each its own process, and prints what each said. Each consumer's pid must be in
# the producer's list of consumers (lf_channel_peers).
#   run_fan_out.sh PRODUCER CONSUMER [CONSUMERS [MESSAGES]]
# PRODUCER and CONSUMER are fan_out executables (C or C++, the same or not).
producer=$1 consumer=$2 consumers=${3:-4} messages=${4:-100000}
name="fan-out-$$"
log=$(mktemp -d)
"$producer" producer "$name" "$consumers" "$messages" >"$log/producer" 2>&1 & prod=$!
pids=""
i=0
while [ "$i" -lt "$consumers" ]; do
  "$consumer" consumer "$name" "$consumers" "$messages" >"$log/consumer-$i" 2>&1 & pids="$pids $!"
  i=$((i + 1))
done
failed=0
for p in $pids; do wait "$p" || failed=$((failed + 1)); done
wait $prod; prc=$?
for p in $pids; do
  grep -q "^  slot [0-9]*: alive, pid $p," "$log/producer" ||
    { echo "consumer $p is not in the producer's lf_channel_peers" >&2; failed=$((failed + 1)); }
done
cat "$log/producer" "$log"/consumer-*
rm -rf "$log"
if [ $failed -ne 0 ] || [ $prc -ne 0 ]; then
  echo "fan-out demo FAILED ($failed failures among $consumers consumers, producer exit $prc)" >&2
  exit 1
fi
echo "fan-out demo passed"
