#!/bin/bash
# Alternates the before and after builds of lf-bench; prints the 8 B p50 rows.
export XDG_RUNTIME_DIR=/tmp
for round in 1 2 3 4 5 6 7; do
  for which in before after; do
    out=$(/tmp/lf-bench-$which --sizes 8 --bw-sizes 64K --modes capi,busy --payloads copy,zero-copy --no-peers --iters 100000 2>&1)
    echo "$out" | awk -v w=$which -v r=$round '
      /^  C API copy / && !c {print w, r, "capi-copy", $4; c=1}
      /^  C API loan / && !l {print w, r, "capi-loan", $4; l=1}
      /^  busy +copy +8 / {print w, r, "rust-busy-copy", $4}
      /^  busy +zero-copy +8 / {print w, r, "rust-busy-zero-copy", $4}'
  done
done
