#!/usr/bin/env bash
# A fan-in across two host identities over MPI, beside raw MPI with MPI_ANY_SOURCE, in one run:
# for each producer count N, `lf-bench --fan-in --over mpi` under mpirun (rank 0 the consumer
# with LF_HOST_ID=a, N producer ranks with LF_HOST_ID=b, so every producer attaches over MPI)
# and benchmarks/mpi_fanin.c with the same N + 1 ranks and the same MPI transport, alternated
# round by round (the best round of each is reported). Both use the protocol of lf-bench's
# fan-in rows (crates/tools/src/bin/lf-bench/fanin/gather.rs): saturation, a warm-up, a timed
# window, the consumer's time per message over blocks of 64, the aggregate rate and fairness.
# Writes into OUTDIR:
#   report.txt     the table (text)
#   rows.jsonl     every round's JSON line, lava-flow's and Open MPI's
#   machine.txt    the date, the commands, the machine, the versions
#
#   benchmarks/run-fan-in-mpi.sh OUTDIR [--producers 1,2] [--rounds 2] [--size 64] [--quick]
#
# BTL (default self,vader: MPI's shared memory between the ranks, which lava-flow sees on two
# hosts) picks Open MPI's transport for both; BTL=self,tcp adds --mca btl_tcp_if_include lo.
# Builds (unless SKIP_BUILD=1) `cargo build --release --features mpi --bin lf-bench` and
# benchmarks/mpi_fanin.c with mpicc; with SKIP_BUILD=1, point LF_BENCH and LF_BENCH_MPI_FANIN
# at binaries built elsewhere. Small enough for a 2-core machine with --quick (ranks share the
# cores: the report's load average says how busy the machine was).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${1:?usage: benchmarks/run-fan-in-mpi.sh OUTDIR [--producers 1,2] [--rounds 2] [--size 64] [--quick]}
shift
producers=1,2
rounds=2
bench_args=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --producers) producers=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --size) bench_args+=(--size "$2"); shift 2 ;;
    --quick) bench_args+=(--warm 0.1 --window 0.5); shift ;;
    *) echo "run-fan-in-mpi: unknown option $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"

if [[ -z ${SKIP_BUILD:-} ]]; then
  export PATH="$HOME/.cargo/bin:$PATH"
  cargo build --release --features mpi --bin lf-bench
  mkdir -p "$root/target/peers"
  mpicc -std=c99 -O2 -o "$root/target/peers/mpi_fanin" benchmarks/mpi_fanin.c
fi
lf_bench=${LF_BENCH:-$root/target/release/lf-bench}
mpi_fanin=${LF_BENCH_MPI_FANIN:-$root/target/peers/mpi_fanin}
btl=${BTL:-self,vader}
mpirun=(mpirun --oversubscribe --bind-to none --mca btl "$btl")
if [[ $btl == *tcp* ]]; then
  mpirun+=(--mca btl_tcp_if_include lo)
fi
if [[ $(id -u) == 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# The channels' sockets (same-host producers, none here) in a directory of this run's own.
export LF_RUNTIME_DIR=${LF_RUNTIME_DIR:-$(mktemp -d)}

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "command: benchmarks/run-fan-in-mpi.sh $out --producers $producers --rounds $rounds ${bench_args[*]}"
  echo "lava-flow: ${mpirun[*]} -np 1 -x LF_HOST_ID=a $lf_bench --fan-in --over mpi --json ${bench_args[*]} : -np N -x LF_HOST_ID=b (the same)"
  echo "Open MPI:  ${mpirun[*]} -np N+1 $mpi_fanin ${bench_args[*]}"
  echo "lava-flow commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "kernel: $(uname -r)"
  echo "cpus: $(nproc), $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)"
  echo "Open MPI: $(mpirun --version 2>/dev/null | head -1)"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$out/machine.txt"

rows=$out/rows.jsonl
: >"$rows"
IFS=, read -r -a counts <<<"$producers"
for n in "${counts[@]}"; do
  for ((round = 1; round <= rounds; round++)); do
    timeout 120 "${mpirun[@]}" -np 1 -x LF_HOST_ID=a -x LF_RUNTIME_DIR "$lf_bench" --fan-in --over mpi --json "${bench_args[@]}" \
      : -np "$n" -x LF_HOST_ID=b -x LF_RUNTIME_DIR "$lf_bench" --fan-in --over mpi --json "${bench_args[@]}" \
      | grep '^{' >>"$rows" || echo "run-fan-in-mpi: lava-flow with $n producers, round $round, gave no result" >&2
    timeout 120 "${mpirun[@]}" -np $((n + 1)) "$mpi_fanin" "${bench_args[@]}" \
      | grep '^{' >>"$rows" || echo "run-fan-in-mpi: Open MPI with $n producers, round $round, gave no result" >&2
  done
done

python3 - "$rows" <<'EOF' | tee "$out/report.txt"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
best = {}
for r in rows:
    key = (r["producers"], r["who"])
    if key not in best or r["msgs_per_s"] > best[key]["msgs_per_s"]:
        best[key] = r
print("Fan-in across host identities over MPI (best round of each), beside raw MPI with MPI_ANY_SOURCE")
print(f"{'producers':>9}  {'who':<26} {'msgs/s':>12} {'p50 ns/msg':>11} {'p99 ns/msg':>11} {'fairness':>9} {'errors':>6}  vs Open MPI")
for n in sorted({k[0] for k in best}):
    raw = best.get((n, "Open MPI"))
    for who in ("lava-flow fan-in over mpi", "Open MPI"):
        r = best.get((n, who))
        if r is None:
            print(f"{n:>9}  {who:<26} (no result)")
            continue
        per = r["per_producer"]
        fair = min(per) / max(per) if per and max(per) else float("nan")
        ratio = f"{r['msgs_per_s'] / raw['msgs_per_s']:.2f}x" if raw and who != "Open MPI" else ""
        print(f"{n:>9}  {who:<26} {r['msgs_per_s']:>12.0f} {r['per_msg_p50_ns']:>11.1f} {r['per_msg_p99_ns']:>11.1f} {fair:>9.2f} {r['errors']:>6}  {ratio}")
routes = [r for r in rows if "routes" in r]
if routes:
    print("lava-flow's slots (last run):", ", ".join(f"slot {s['slot']}: {s['route']} from rank {s['rank']}" for s in routes[-1]["routes"]))
EOF
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/machine.txt"
