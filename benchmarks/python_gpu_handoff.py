#!/usr/bin/env python3
"""Python's GPU hand-off beside torch.multiprocessing and lava-flow's C path, in one run.

Two Python processes (B spawned): A hands a lava-flow GPU buffer X to B, B answers with its
own GPU buffer Y, half a round trip measured on A (p50/p99). Cases per size (4 KiB, 64 KiB,
1 MiB unless --sizes says otherwise):
  py_handoff   A sends X (contents in place); B: recv, torch.from_dlpack(msg) on its stream,
               release; sends Y; A: recv, torch.from_dlpack, release. Before resending X, A waits
               for lava-flow's completion of its previous send (the C path's contract).
  py_torch_op  the same with GPU work on both sides: A fills X on its stream and sends it
               ordered on that stream (send_buffer(stream=)); B copies X into Y on its stream
               and sends Y ordered on it; A reads Y's first word on its stream. A synchronises
               its stream at the end of each round trip; every round's value is checked.
  tmp_handoff  torch.multiprocessing's queues handing a CUDA tensor of the size A->B and B's
               own one back (what PyTorch users do today), B touching nothing.
  tmp_torch_op the same with B copying A's tensor into its own before answering.
  C path       benchmarks/lf_cuda_pingpong.cu (lf_handoff, lf_gpu_pingpong), built with nvcc
               against this package's lava_flow.h and liblava_flow.so where nvcc is present
               (--c-binary gives a built one), run in the same job.
Output: table lines, plus one `JSON {...}` line per row (grep '^JSON '); the last line per
size compares py_handoff with the C path's lf_handoff (target: at most C + 2 us).

    python3 benchmarks/python_gpu_handoff.py [--quick] [--sizes 4096,65536] [--no-c]
"""
import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TIMEOUT = 30.0


def stats(values):
    v = sorted(values)
    if not v:
        return 0.0, 0.0
    return v[len(v) // 2], v[min(len(v) - 1, int(len(v) * 0.99))]


def emit(row):
    print("JSON " + json.dumps(row), flush=True)


# ---- lava-flow, Python on both sides ----

def lf_setup(tag, is_a):
    import lava_flow as lf
    import torch
    torch.cuda.init()
    ctx = lf.Context(gpu="required", gpu_device=bytes(cuda_uuid(torch)), strict_gpu=True)
    kw = dict(wait=lf.Wait.BUSY_POLL, strict_gpu=True, rendezvous_timeout=TIMEOUT)
    if is_a:
        tx = lf.producer(ctx, tag + "-a2b", **kw)
        rx = lf.consumer(ctx, tag + "-b2a", **kw)
    else:
        rx = lf.consumer(ctx, tag + "-a2b", **kw)
        tx = lf.producer(ctx, tag + "-b2a", **kw)
    return lf, torch, ctx, tx, rx


def cuda_uuid(torch, device=0):
    u = torch.cuda.get_device_properties(device).uuid
    raw = getattr(u, "bytes", None)
    return bytes(raw) if raw is not None else bytes.fromhex(str(u).removeprefix("GPU-").replace("-", ""))


def lf_side_b(tag, plan):
    lf, torch, ctx, tx, rx = lf_setup(tag, False)
    stream = torch.cuda.Stream()
    for size, op, rounds in plan:
        y = ctx.alloc(size, lf.Memory.GPU_DEVICE_LOCAL)
        ty = torch.from_dlpack(y)
        last = None
        for _ in range(rounds):
            m = rx.recv(timeout=TIMEOUT)
            with torch.cuda.stream(stream):
                t = torch.from_dlpack(m)
                if op:
                    # Y is rewritten: its previous send must be complete.
                    if last is not None:
                        tx.wait_completed(last, timeout=TIMEOUT)
                    ty.copy_(t)
            del t
            m.release()
            last = tx.send_buffer(y, stream=stream) if op else tx.send_buffer(y)
        stream.synchronize()
        if last is not None:
            tx.wait_completed(last, timeout=TIMEOUT)
        del ty
        y.free()
    print(lf._cuda_imports(), flush=True)


def lf_side_a(tag, sizes, warm, iters, rows):
    lf, torch, ctx, tx, rx = lf_setup(tag, True)
    stream = torch.cuda.Stream()
    info = ctx.device_info()
    print(f"lava-flow {lf.version()}, device {info['name']}, transport {tx.transport}", flush=True)
    emit({"case": "py_config", "device": info["name"], "lava_flow": lf.version(), "torch": torch.__version__,
          "transport": tx.transport, "mps_pipe_dir": os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "")})
    for op in (False, True):
        case = "py_torch_op" if op else "py_handoff"
        print(f"\n== {case}: half round trip (us), {iters} iterations after {warm} warm-up")
        print(f"  {'size':>10} {'p50_us':>10} {'p99_us':>10}")
        for size in sizes:
            x = ctx.alloc(size, lf.Memory.GPU_DEVICE_LOCAL)
            tx_ = torch.from_dlpack(x)
            half, last, wrong = [], None, 0
            for i in range(warm + iters):
                value = i % 251
                t0 = time.perf_counter()
                if last is not None:
                    tx.wait_completed(last, timeout=TIMEOUT)
                if op:
                    with torch.cuda.stream(stream):
                        tx_.fill_(value)
                    last = tx.send_buffer(x, stream=stream)
                else:
                    last = tx.send_buffer(x)
                m = rx.recv(timeout=TIMEOUT)
                with torch.cuda.stream(stream):
                    t = torch.from_dlpack(m)
                    if op:
                        first = t[0].clone()
                del t
                m.release()
                if op:
                    stream.synchronize()
                t1 = time.perf_counter()
                if op and int(first) != value:
                    wrong += 1
                if i >= warm:
                    half.append((t1 - t0) * 1e6 / 2)
            tx.wait_completed(last, timeout=TIMEOUT)
            del tx_
            x.free()
            p50, p99 = stats(half)
            print(f"  {size:>10} {p50:>10.2f} {p99:>10.2f}" + (f"  {wrong} WRONG" if wrong else ""), flush=True)
            row = {"case": case, "size": size, "iters": iters, "p50_us": round(p50, 3), "p99_us": round(p99, 3)}
            if op:
                row["wrong"] = wrong
            emit(row)
            rows.append(row)
            if wrong:
                raise SystemExit(f"{case} {size} B: {wrong} rounds read another round's value")
    made, alive, cached = lf._cuda_imports()
    print(f"A's CUDA imports of B's arenas: {made} made, {alive} alive, {cached} cached")
    emit({"case": "py_imports", "made": made, "alive": alive, "cached": cached})


def run_lf(sizes, warm, iters):
    tag = f"pygh-{os.getpid()}"
    plan = [(s, op, warm + iters) for op in (False, True) for s in sizes]
    b = mp.get_context("spawn").Process(target=lf_side_b, args=(tag, plan))
    b.start()
    rows = []
    try:
        lf_side_a(tag, sizes, warm, iters, rows)
    finally:
        b.join(120)
        if b.is_alive():
            b.kill()
    if b.exitcode != 0:
        raise SystemExit(f"process B failed with exit code {b.exitcode}")
    return rows


# ---- torch.multiprocessing ----

def tmp_side_b(q_ab, q_ba, plan):
    import torch
    for size, op, rounds in plan:
        mine = torch.zeros(size, dtype=torch.uint8, device="cuda")
        for _ in range(rounds):
            t = q_ab.get(timeout=TIMEOUT)
            if op:
                mine.copy_(t)
                torch.cuda.current_stream().synchronize()
            del t
            q_ba.put(mine)
    q_ba.put(None)


def run_tmp(sizes, warm, iters):
    import torch
    import torch.multiprocessing as tmp
    ctx = tmp.get_context("spawn")
    q_ab, q_ba = ctx.Queue(), ctx.Queue()
    plan = [(s, op, warm + iters) for op in (False, True) for s in sizes]
    b = ctx.Process(target=tmp_side_b, args=(q_ab, q_ba, plan))
    b.start()
    try:
        for op in (False, True):
            case = "tmp_torch_op" if op else "tmp_handoff"
            print(f"\n== {case}: torch.multiprocessing queues, half round trip (us)")
            print(f"  {'size':>10} {'p50_us':>10} {'p99_us':>10}")
            for size in sizes:
                x = torch.zeros(size, dtype=torch.uint8, device="cuda")
                half = []
                for i in range(warm + iters):
                    t0 = time.perf_counter()
                    if op:
                        x.fill_(i % 251)
                        torch.cuda.current_stream().synchronize()
                    q_ab.put(x)
                    y = q_ba.get(timeout=TIMEOUT)
                    del y
                    t1 = time.perf_counter()
                    if i >= warm:
                        half.append((t1 - t0) * 1e6 / 2)
                p50, p99 = stats(half)
                print(f"  {size:>10} {p50:>10.2f} {p99:>10.2f}", flush=True)
                emit({"case": case, "size": size, "iters": iters, "p50_us": round(p50, 3), "p99_us": round(p99, 3)})
        q_ba.get(timeout=TIMEOUT)
    finally:
        b.join(60)
        if b.is_alive():
            b.kill()


# ---- the C path ----

def c_binary(args):
    if args.c_binary:
        return args.c_binary
    nvcc = shutil.which("nvcc")
    if not nvcc:
        return None
    import lava_flow as lf
    lib = Path(lf.get_library())
    out = Path(tempfile.mkdtemp(prefix="lfcp-")) / "lf_cuda_pingpong"
    cmd = [nvcc, "-O2", "-I" + lf.get_include(), "-I" + str(HERE), str(HERE / "lf_cuda_pingpong.cu"), str(lib),
           "-Xlinker", "-rpath=" + str(lib.parent), "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"building the C path failed ({' '.join(cmd)}):\n{r.stderr[-2000:]}")
        return None
    return str(out)


def run_c(args, sizes):
    exe = c_binary(args)
    if not exe:
        print("\n== C path: nvcc not found; build and run it with\n"
              "   nvcc -O2 -I$(python3 -c 'import lava_flow as l; print(l.get_include())') "
              "benchmarks/lf_cuda_pingpong.cu $(python3 -c 'import lava_flow as l; print(l.get_library())') "
              "-o lf_cuda_pingpong && ./lf_cuda_pingpong --sizes " + ",".join(map(str, sizes)))
        return {}
    cmd = [exe, "--sizes", ",".join(map(str, sizes))] + (["--quick"] if args.quick else [])
    print(f"\n== C path: {' '.join(cmd)}", flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    rows = {}
    for line in r.stdout.splitlines():
        if line.startswith("JSON "):
            row = json.loads(line[5:])
            row["case"] = "c_" + row["case"]
            emit(row)
            rows[(row["case"], row.get("size"))] = row
        elif line.strip():
            print("  " + line)
    if r.returncode != 0:
        print(f"C path failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a quarter of the iterations")
    ap.add_argument("--sizes", default="4096,65536,1048576")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--warm", type=int, default=200)
    ap.add_argument("--no-c", action="store_true", help="skip the C path")
    ap.add_argument("--no-tmp", action="store_true", help="skip torch.multiprocessing")
    ap.add_argument("--c-binary", help="a built benchmarks/lf_cuda_pingpong.cu to run instead of building it")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    warm, iters = (args.warm // 4, args.iters // 4) if args.quick else (args.warm, args.iters)
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    py_rows = {(r["case"], r["size"]): r for r in run_lf(sizes, warm, iters)}
    if not args.no_tmp:
        run_tmp(sizes, warm, iters)
    c_rows = {} if args.no_c else run_c(args, sizes)
    # Python's hand-off against the C path's, measured in this run: at most C + 2 us.
    for py_case, c_case in (("py_handoff", "c_lf_handoff"), ("py_torch_op", "c_lf_gpu_pingpong")):
        for size in sizes:
            py, c = py_rows.get((py_case, size)), c_rows.get((c_case, size))
            if py and c:
                over = py["p50_us"] - c["p50_us"]
                print(f"{py_case} {size} B: p50 {py['p50_us']:.2f} us, C {c['p50_us']:.2f} us, "
                      f"{over:+.2f} us ({'within' if over <= 2.0 else 'over'} C + 2 us)")
                emit({"case": "py_vs_c", "py_case": py_case, "c_case": c_case, "size": size,
                      "py_p50_us": py["p50_us"], "c_p50_us": c["p50_us"], "over_us": round(over, 3),
                      "within_2us": over <= 2.0})
    print("\npython_gpu_handoff: done")


if __name__ == "__main__":
    sys.exit(main())
