#!/bin/sh
# Runs a test under valgrind: fails if the test fails, if valgrind reports an invalid access
# or a definite leak, or if valgrind did not really run (no ERROR SUMMARY line).
valgrind="$1"; shift
log=$(mktemp)
"$valgrind" --error-exitcode=99 --suppressions="$(dirname "$0")/valgrind.supp" --leak-check=full --errors-for-leak-kinds=definite \
  --show-leak-kinds=definite --log-file="$log" "$@"
rc=$?
cat "$log"
if ! grep -q "ERROR SUMMARY:" "$log"; then
  echo "valgrind did not run the test" >&2
  rc=98
fi
rm -f "$log"
exit $rc
