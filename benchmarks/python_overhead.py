"""The Python binding's cost per message over the C path, and a naive ctypes wrapper's.

    python benchmarks/python_overhead.py [--batches 400] [--batch 200] [--json out.json]

One process holds both ends of a channel (busy-poll, as benchmarks/msg_path_cost.c), so no
second core and no wake-up is measured: only the software path of one 8-byte message, sent,
received and released on this thread. Batches of the four loops below run interleaved (so
machine noise hits them alike); each batch gives a time per message; the report is the median
(p50) and p90 over the batches, and the overhead of each Python loop over the C loop:
  C          lf_send + lf_try_recv + lf_release in C (a loop compiled here, called once per batch
             through ctypes, on the channels' own handles: one library)
  lava_flow  ch.send(b) ; m = rx.try_recv() ; m.release()
  lava_flow, blocking recv   ch.send(b) ; m = rx.recv(1.0) ; m.release()  (GIL released)
  ctypes     the same three C functions called through ctypes (argtypes set, structs reused)
Needs the package installed (pip install ./crates/python) and a C compiler.
"""
import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import lava_flow as lf

C_LOOP = r"""
#include <lava_flow.h>
#include <stdint.h>
#include <time.h>
/* ns for `iters` messages: send, receive, release; negative: the failing status. */
double c_loop(uintptr_t tx, uintptr_t rx, long iters, const void *src, size_t len) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < iters; i++) {
        lf_message m;
        lf_status s = lf_send((lf_channel *)tx, src, len, 0, NULL);
        if (s == LF_OK) s = lf_try_recv((lf_channel *)rx, &m);
        if (s == LF_OK) s = lf_release((lf_channel *)rx, &m);
        if (s != LF_OK) return -(double)s;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
}
"""


class Message(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("len", ctypes.c_size_t), ("sequence", ctypes.c_uint64),
                ("session", ctypes.c_uint64), ("flags", ctypes.c_uint32), ("reserved", ctypes.c_uint32),
                ("ready_value", ctypes.c_uint64)]


def build_c_loop(tmp):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("a C compiler (cc) is needed for the C loop")
    src = Path(tmp) / "c_loop.c"
    src.write_text(C_LOOP)
    out = Path(tmp) / "c_loop.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", f"-I{lf.get_include()}", str(src), lf.get_library(),
                    "-o", str(out)], check=True)
    lib = ctypes.CDLL(str(out))
    lib.c_loop.restype = ctypes.c_double
    lib.c_loop.argtypes = [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_long, ctypes.c_char_p, ctypes.c_size_t]
    return lib


def channel_pair(ctx):
    name = "pybench-" + uuid.uuid4().hex[:8]
    cfg = dict(wait=lf.Wait.BUSY_POLL, capacity=256)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("rx", lf.consumer(ctx, name, **cfg)))
    t.start()
    tx = lf.producer(ctx, name, **cfg)
    t.join()
    return tx, out["rx"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=400)
    ap.add_argument("--batch", type=int, default=200, help="messages per batch")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    ctx = lf.Context(gpu="disabled")
    tx, rx = channel_pair(ctx)
    payload = b"12345678"
    n = args.batch

    with tempfile.TemporaryDirectory() as tmp:
        c = build_c_loop(tmp)
        raw = ctypes.CDLL(lf.get_library())  # the loaded library (same SONAME, same file)
        raw.lf_send.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int64,
                                ctypes.c_void_p]
        raw.lf_try_recv.argtypes = [ctypes.c_void_p, ctypes.POINTER(Message)]
        raw.lf_release.argtypes = [ctypes.c_void_p, ctypes.POINTER(Message)]
        for f in (raw.lf_send, raw.lf_try_recv, raw.lf_release):
            f.restype = ctypes.c_uint32
        txh, rxh = tx.handle, rx.handle

        def c_batch():
            ns = c.c_loop(txh, rxh, n, payload, len(payload))
            if ns < 0:
                raise SystemExit(f"C loop failed with status {-ns}")
            return ns / n

        def py_batch():
            send, recv = tx.send, rx.try_recv
            t0 = time.perf_counter_ns()
            for _ in range(n):
                send(payload)
                recv().release()
            return (time.perf_counter_ns() - t0) / n

        def py_blocking_batch():
            send, recv = tx.send, rx.recv
            t0 = time.perf_counter_ns()
            for _ in range(n):
                send(payload)
                recv(1.0).release()
            return (time.perf_counter_ns() - t0) / n

        def ctypes_batch():
            msg = Message()
            ref = ctypes.byref(msg)
            send, recv, release = raw.lf_send, raw.lf_try_recv, raw.lf_release
            t0 = time.perf_counter_ns()
            for _ in range(n):
                if send(txh, payload, 8, 0, None) or recv(rxh, ref) or release(rxh, ref):
                    raise SystemExit("ctypes loop failed")
            return (time.perf_counter_ns() - t0) / n

        loops = {"C": c_batch, "lava_flow": py_batch, "lava_flow, blocking recv": py_blocking_batch,
                 "ctypes": ctypes_batch}
        times = {k: [] for k in loops}
        for f in loops.values():  # warm up
            f()
        for _ in range(args.batches):
            for k, f in loops.items():
                times[k].append(f())

    p50 = {k: statistics.median(v) for k, v in times.items()}
    p90 = {k: statistics.quantiles(v, n=10)[-1] for k, v in times.items()}
    print(f"{n} messages of 8 bytes per batch, {args.batches} batches; ns per message "
          "(send + receive + release):")
    print(f"{'loop':28} {'p50':>8} {'p90':>8} {'overhead over C, p50':>22}")
    for k in loops:
        over = "" if k == "C" else f"{p50[k] - p50['C']:.0f} ns"
        print(f"{k:28} {p50[k]:8.0f} {p90[k]:8.0f} {over:>22}")
    result = {"batch": n, "batches": args.batches, "p50_ns": p50, "p90_ns": p90,
              "overhead_p50_ns": {k: p50[k] - p50["C"] for k in loops if k != "C"}}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    limit = 1000.0
    over = result["overhead_p50_ns"]["lava_flow"]
    print(f"lava_flow overhead p50 {over:.0f} ns per message: "
          f"{'within' if over <= limit else 'OVER'} the 1 us budget; ctypes: "
          f"{result['overhead_p50_ns']['ctypes']:.0f} ns")


if __name__ == "__main__":
    main()
