#!/usr/bin/env python3
"""Python's GPU hand-off beside torch.multiprocessing and lava-flow's C path, in one run.

Two Python processes (B spawned): A hands a lava-flow GPU buffer X to B, B answers with its
own GPU buffer Y, half a round trip measured on A (p50/p99). Cases per size (4 KiB, 64 KiB,
1 MiB unless --sizes says otherwise):
  py_handoff   A sends X (contents in place); B: recv, a torch tensor of it on its stream
               (torch.from_dlpack(msg.__dlpack__(stream=)), see view()), release; sends Y; A: recv,
               the same, release. Before resending X, A waits
               for lava-flow's completion of its previous send (the C path's contract). Each side
               makes its stream current once, around its loop (torch.cuda.stream), as a program
               does: entering and leaving that context costs PyTorch microseconds per round.
  py_handoff_ordered  the same, sent stream-ordered (send_buffer(stream=): a semaphore signal on
               the sender's stream, which the receiver's stream waits for in __dlpack__): the
               work of the C path's lf_handoff, which py_handoff leaves out (a signal and a wait,
               about 1 us each under MPS); the like-for-like comparison with the C path.
  py_torch_op  the same with GPU work on both sides: A fills X on its stream and sends it
               ordered on that stream (send_buffer(stream=)); B copies X into Y on its stream
               and sends Y ordered on it; A reads Y's first word on its stream. A synchronises
               its stream at the end of each round trip; every round's value is checked.
  *_on_gpu     the two above with the consumers releasing at once, the producer's released
               semaphore signalled on their stream (released_semaphore=True on every channel), and
               the producers' wait_completed(seq, stream=) waiting for it on the GPU.
  py_tensor    PyTorch tensors of the default caching allocator (or of what
               PYTORCH_CUDA_ALLOC_CONF makes, for both processes) by reference: A sends its
               tensor with send_tensor, B takes torch.from_dlpack(msg), releases and answers
               with its own tensor the same way (contexts without a Vulkan device: the cuda_ipc
               route); before resending, A waits for its previous send's completion. Target: at
               most 0.05x torch.multiprocessing's tmp_handoff p50 (the last lines compare them).
  tmp_handoff  torch.multiprocessing's queues handing a CUDA tensor of the size A->B and B's
               own one back (what PyTorch users do today), B touching nothing.
  tmp_torch_op the same with B copying A's tensor into its own before answering.
  C path       benchmarks/lf_cuda_pingpong.cu (lf_handoff, lf_gpu_pingpong), built with nvcc
               against this package's lava_flow.h and liblava_flow.so where nvcc is present
               (--c-binary gives a built one), run in the same job.
Output: table lines, plus one `JSON {...}` line per row (grep '^JSON '); the last line per
size compares py_handoff and py_handoff_ordered with the C path's lf_handoff (target: at most
C + 2 us; py_handoff_ordered does the same work as lf_handoff, py_handoff less).

    python3 benchmarks/python_gpu_handoff.py [--quick] [--sizes 4096,65536] [--no-c]
    python3 benchmarks/python_gpu_handoff.py --breakdown [--sizes 65536]   (where the time goes)
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

def lf_setup(tag, is_a, on_gpu=False):
    import lava_flow as lf
    import torch
    torch.cuda.init()
    ctx = lf.Context(gpu="required", gpu_device=bytes(cuda_uuid(torch)), strict_gpu=True)
    kw = dict(wait=lf.Wait.BUSY_POLL, strict_gpu=True, rendezvous_timeout=TIMEOUT)
    if on_gpu:
        # Producers: a released semaphore; consumers: release at once, signalling it on the GPU.
        kw["released_semaphore"] = True
    if is_a:
        tx = lf.producer(ctx, tag + "-a2b", **kw)
        rx = lf.consumer(ctx, tag + "-b2a", **kw)
    else:
        rx = lf.consumer(ctx, tag + "-a2b", **kw)
        tx = lf.producer(ctx, tag + "-b2a", **kw)
    return lf, torch, ctx, tx, rx


def view(torch, m, stream):
    """The message as a torch tensor used on `stream`: torch.from_dlpack of the capsule that
    msg.__dlpack__(stream=) makes, which is what torch.from_dlpack(msg) does after looking up
    the current stream in Python, a lookup that costs about 20 us a call (the breakdown's
    "torch.from_dlpack(torch tensor)": any DLPack producer's price, not lava-flow's)."""
    return torch.from_dlpack(m.__dlpack__(stream=stream.cuda_stream, max_version=(1, 0)))


def cuda_uuid(torch, device=0):
    u = torch.cuda.get_device_properties(device).uuid
    raw = getattr(u, "bytes", None)
    return bytes(raw) if raw is not None else bytes.fromhex(str(u).removeprefix("GPU-").replace("-", ""))


# The lava-flow cases: `plain` hands the buffer off synchronised on the host (no semaphore);
# `ordered` sends it stream-ordered (send_buffer(stream=): a semaphore signal on A's stream, and
# B's stream waits for it in __dlpack__), which is the C path lf_handoff's work; `op` adds a
# torch op on each side.
MODES = ("plain", "ordered", "op")
CASES = {"plain": "py_handoff", "ordered": "py_handoff_ordered", "op": "py_torch_op"}


def lf_side_b(tag, plan, on_gpu):
    lf, torch, ctx, tx, rx = lf_setup(tag, False, on_gpu)
    stream = torch.cuda.Stream()
    for size, mode, rounds in plan:
        op, ordered = mode == "op", mode != "plain"
        y = ctx.alloc(size, lf.Memory.GPU_DEVICE_LOCAL)
        ty = torch.from_dlpack(y)
        last = None
        # The stream is made current once, around the loop, as a program does.
        with torch.cuda.stream(stream):
            for _ in range(rounds):
                m = rx.recv(timeout=TIMEOUT)
                t = view(torch, m, stream)
                if op:
                    # Y is rewritten: its previous send must be complete.
                    if last is not None:
                        if on_gpu:
                            tx.wait_completed(last, timeout=TIMEOUT, stream=stream)
                        else:
                            tx.wait_completed(last, timeout=TIMEOUT)
                    ty.copy_(t)
                del t
                m.release()
                last = tx.send_buffer(y, stream=stream) if ordered else tx.send_buffer(y)
        stream.synchronize()
        if last is not None:
            tx.wait_completed(last, timeout=TIMEOUT)
        del ty
        y.free()
    print(lf._cuda_imports(), flush=True)


def lf_side_a(tag, sizes, warm, iters, rows, on_gpu):
    lf, torch, ctx, tx, rx = lf_setup(tag, True, on_gpu)
    stream = torch.cuda.Stream()
    info = ctx.device_info()
    print(f"lava-flow {lf.version()}, device {info['name']}, transport {tx.transport}", flush=True)
    emit({"case": "py_config", "device": info["name"], "lava_flow": lf.version(), "torch": torch.__version__,
          "transport": tx.transport, "mps_pipe_dir": os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "")})
    for mode in MODES:
        op, ordered = mode == "op", mode != "plain"
        case = CASES[mode] + ("_on_gpu" if on_gpu else "")
        print(f"\n== {case}: half round trip (us), {iters} iterations after {warm} warm-up")
        print(f"  {'size':>10} {'p50_us':>10} {'p99_us':>10}")
        for size in sizes:
            x = ctx.alloc(size, lf.Memory.GPU_DEVICE_LOCAL)
            tx_ = torch.from_dlpack(x)
            half, last, wrong = [], None, 0
            # The stream is made current once, around the loop, as a program does.
            with torch.cuda.stream(stream):
                for i in range(warm + iters):
                    value = i % 251
                    t0 = time.perf_counter()
                    if last is not None:
                        if on_gpu:
                            tx.wait_completed(last, timeout=TIMEOUT, stream=stream)
                        else:
                            tx.wait_completed(last, timeout=TIMEOUT)
                    if op:
                        tx_.fill_(value)
                    last = tx.send_buffer(x, stream=stream) if ordered else tx.send_buffer(x)
                    m = rx.recv(timeout=TIMEOUT)
                    t = view(torch, m, stream)
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
    releases = gpu_releases(lf)
    if releases is not None:
        print(f"A's GPU releases (at once, deferred after events, on the GPU): {list(releases)}")
        emit({"case": "py_releases", "on_gpu": on_gpu, "releases": list(releases)})


def run_lf(sizes, warm, iters, on_gpu=False):
    tag = f"pygh-{os.getpid()}-{'gpu' if on_gpu else 'ev'}"
    plan = [(s, mode, warm + iters) for mode in MODES for s in sizes]
    b = mp.get_context("spawn").Process(target=lf_side_b, args=(tag, plan, on_gpu))
    b.start()
    rows = []
    try:
        lf_side_a(tag, sizes, warm, iters, rows, on_gpu)
    finally:
        b.join(120)
        if b.is_alive():
            b.kill()
    if b.exitcode != 0:
        raise SystemExit(f"process B failed with exit code {b.exitcode}")
    return rows


# ---- where py_handoff's time goes (--breakdown) ----
#
# The hand-off of py_handoff, each Python-level step timed in-process with perf_counter_ns on
# both sides; B's timestamps come back to A in a file. perf_counter_ns is CLOCK_MONOTONIC on
# Linux, one clock for both processes, so the gaps between them (A's send to B's recv
# returning, B's release to A's wait_completed returning) are measured too. Modes:
#   deferred  the consumers release after their streams by CUDA events (the default);
#   on_gpu    the consumers release at once and signal the producer's released semaphore on
#             their stream (Channel(..., released_semaphore=True) on both ends); the producer's
#             wait_completed(seq, stream=S) waits on the host for the release and on S for the
#             signal.

# torch.from_dlpack(msg) in its three parts: __dlpack_device__, __dlpack__ (lava-flow's), and
# torch's import of the capsule.
A_STEPS = ("wait_completed", "send_buffer", "recv", "dlpack_device", "dlpack", "torch_import", "del_tensor",
           "release")
B_STEPS = ("recv_wait", "dlpack_device", "dlpack", "torch_import", "del_tensor", "release", "send_buffer")


def bd_from_dlpack(torch, m, stream, ns, out):
    """torch.from_dlpack(m) on `stream`, as torch does it, each part's end time appended."""
    m.__dlpack_device__()
    out.append(ns())
    capsule = m.__dlpack__(stream=stream.cuda_stream, max_version=(1, 0))
    out.append(ns())
    t = torch.from_dlpack(capsule)
    out.append(ns())
    return t


def bd_torch_floor(torch, size, stream, n):
    """p50 (us) of torch.from_dlpack of a torch CUDA tensor on `stream`: DLPack's cost with no
    lava-flow in it, the floor for any producer's tensor."""
    x = torch.empty(size, dtype=torch.uint8, device="cuda")
    ns, v = time.perf_counter_ns, []
    with torch.cuda.stream(stream):
        for _ in range(n):
            t0 = ns()
            t = torch.from_dlpack(x)
            v.append(ns() - t0)
            del t
    return stats(v)[0] / 1000.0


def gpu_releases(lf):
    f = getattr(lf, "_gpu_releases", None)
    return f() if f else None


def bd_setup(tag, is_a, on_gpu):
    import lava_flow as lf
    import torch
    torch.cuda.init()
    ctx = lf.Context(gpu="required", gpu_device=bytes(cuda_uuid(torch)), strict_gpu=True)
    kw = dict(wait=lf.Wait.BUSY_POLL, strict_gpu=True, rendezvous_timeout=TIMEOUT)
    if on_gpu:
        kw["released_semaphore"] = True
    names = (tag + "-a2b", tag + "-b2a")
    if is_a:
        tx, rx = lf.producer(ctx, names[0], **kw), lf.consumer(ctx, names[1], **kw)
    else:
        rx, tx = lf.consumer(ctx, names[0], **kw), lf.producer(ctx, names[1], **kw)
    return lf, torch, ctx, tx, rx


def bd_side_b(tag, size, rounds, on_gpu, out_path):
    lf, torch, ctx, tx, rx = bd_setup(tag, False, on_gpu)
    stream = torch.cuda.Stream()
    y = ctx.alloc(size, lf.Memory.GPU_DEVICE_LOCAL)
    ns = time.perf_counter_ns
    rows, last = [], None
    for _ in range(rounds):
        row = [ns()]
        m = rx.recv(timeout=TIMEOUT)
        row.append(ns())
        t = bd_from_dlpack(torch, m, stream, ns, row)
        del t
        row.append(ns())
        m.release()
        row.append(ns())
        last = tx.send_buffer(y)
        row.append(ns())
        rows.append(row)
    stream.synchronize()
    tx.wait_completed(last, timeout=TIMEOUT)
    y.free()
    with open(out_path, "w") as f:
        json.dump({"rows": rows, "releases": gpu_releases(lf)}, f)


def bd_run(size, warm, iters, on_gpu):
    mode = "on_gpu" if on_gpu else "deferred"
    tag = f"pygb-{os.getpid()}-{mode}-{size}"
    out_path = os.path.join(tempfile.mkdtemp(prefix="lfbd-"), "b.json")
    b = mp.get_context("spawn").Process(target=bd_side_b, args=(tag, size, warm + iters, on_gpu, out_path))
    b.start()
    try:
        lf, torch, ctx, tx, rx = bd_setup(tag, True, on_gpu)
        stream = torch.cuda.Stream()
        x = ctx.alloc(size, lf.Memory.GPU_DEVICE_LOCAL)
        ns = time.perf_counter_ns
        before = gpu_releases(lf)
        rows, last = [], None
        for _ in range(warm + iters):
            row = [ns()]
            if last is not None:
                if on_gpu:
                    tx.wait_completed(last, timeout=TIMEOUT, stream=stream)
                else:
                    tx.wait_completed(last, timeout=TIMEOUT)
            row.append(ns())
            last = tx.send_buffer(x)
            row.append(ns())
            m = rx.recv(timeout=TIMEOUT)
            row.append(ns())
            t = bd_from_dlpack(torch, m, stream, ns, row)
            del t
            row.append(ns())
            m.release()
            row.append(ns())
            rows.append(row)
        tx.wait_completed(last, timeout=TIMEOUT)
        stream.synchronize()
        after = gpu_releases(lf)
        floor = bd_torch_floor(torch, size, stream, iters)
        x.free()
    finally:
        b.join(120)
        if b.is_alive():
            b.kill()
    if b.exitcode != 0:
        raise SystemExit(f"breakdown {mode}: process B failed with exit code {b.exitcode}")
    with open(out_path) as f:
        got = json.load(f)
    a_rows, b_rows = rows[warm:], got["rows"][warm:]

    def p50(values):
        return stats(values)[0] / 1000.0

    def p99(values):
        return stats(values)[1] / 1000.0

    print(f"\n== breakdown {mode}, {size} B: p50 (p99) us per step, {iters} iterations after {warm} warm-up")
    result = {"case": "py_breakdown", "mode": mode, "size": size, "iters": iters}
    half = [(r[-1] - r[0]) / 2 for r in a_rows]
    print(f"  {'A half round trip':<34} {p50(half):8.2f} ({p99(half):.2f})")
    result["half_p50_us"] = round(p50(half), 3)
    for i, step in enumerate(A_STEPS):
        v = [r[i + 1] - r[i] for r in a_rows]
        print(f"  {'A ' + step:<34} {p50(v):8.2f} ({p99(v):.2f})")
        result["a_" + step] = round(p50(v), 3)
    for i, step in enumerate(B_STEPS):
        v = [r[i + 1] - r[i] for r in b_rows]
        print(f"  {'B ' + step:<34} {p50(v):8.2f} ({p99(v):.2f})")
        result["b_" + step] = round(p50(v), 3)
    print(f"  {'torch.from_dlpack(torch tensor)':<34} {floor:8.2f}   (DLPack without lava-flow, same process)")
    result["torch_floor"] = round(floor, 3)
    # Across the processes (one monotonic clock).
    gaps = {
        "A send_buffer -> B recv returns": [b[1] - a[2] for a, b in zip(a_rows, b_rows)],
        "B send_buffer -> A recv returns": [a[3] - b[-1] for a, b in zip(a_rows, b_rows)],
        # A's wait for round i+1 waits for B's release of round i.
        "B release -> A wait_completed returns": [a2[1] - b[-2] for a2, b in zip(a_rows[1:], b_rows)],
    }
    for what, v in gaps.items():
        print(f"  {what:<34} {p50(v):8.2f} ({p99(v):.2f})")
        result[what.replace(" -> ", "_to_").replace(" ", "_")] = round(p50(v), 3)
    if before is not None and after is not None:
        counts = [x - y for x, y in zip(after, before)]
        print(f"  A's GPU releases (immediate, deferred, on the GPU): {counts}; B's over its run: {got['releases']}")
        result["a_releases"], result["b_releases"] = counts, got["releases"]
    emit(result)


def run_breakdown(sizes, warm, iters):
    for on_gpu in (False, True):
        for size in sizes:
            try:
                bd_run(size, warm, iters, on_gpu)
            except TypeError as e:
                # An older lava-flow: no released_semaphore on consumers or wait_completed(stream=).
                print(f"\n== breakdown {'on_gpu' if on_gpu else 'deferred'}: not available here ({e})")
                break


# ---- torch.multiprocessing ----

# ---- PyTorch's own tensors by reference (send_tensor) ----

def tensor_setup(tag, is_a):
    import lava_flow as lf
    import torch
    torch.cuda.init()
    ctx = lf.Context(gpu="disabled")
    kw = dict(wait=lf.Wait.BUSY_POLL, rendezvous_timeout=TIMEOUT)
    if is_a:
        tx = lf.producer(ctx, tag + "-a2b", **kw)
        rx = lf.consumer(ctx, tag + "-b2a", **kw)
    else:
        rx = lf.consumer(ctx, tag + "-a2b", **kw)
        tx = lf.producer(ctx, tag + "-b2a", **kw)
    return torch, tx, rx


def tensor_side_b(tag, plan):
    torch, tx, rx = tensor_setup(tag, False)
    for size, rounds in plan:
        mine = torch.zeros(size, dtype=torch.uint8, device="cuda")
        last = None
        for _ in range(rounds):
            m = rx.recv(timeout=TIMEOUT)
            t = torch.from_dlpack(m)
            del t
            m.release()
            if last is not None:
                tx.wait_completed(last, timeout=TIMEOUT)
            last = tx.send_tensor(mine)
        tx.wait_completed(last, timeout=TIMEOUT)


def run_tensor(sizes, warm, iters):
    tag = f"pygh-{os.getpid()}-tensor"
    b = mp.get_context("spawn").Process(target=tensor_side_b, args=(tag, [(s, warm + iters) for s in sizes]))
    b.start()
    rows = []
    try:
        torch, tx, rx = tensor_setup(tag, True)
        print(f"\n== py_tensor: torch tensors by reference (send_tensor, {tx.transport}), half round trip (us)")
        print(f"  {'size':>10} {'p50_us':>10} {'p99_us':>10}")
        for size in sizes:
            x = torch.zeros(size, dtype=torch.uint8, device="cuda")
            half, last = [], None
            for i in range(warm + iters):
                t0 = time.perf_counter()
                if last is not None:
                    tx.wait_completed(last, timeout=TIMEOUT)
                last = tx.send_tensor(x)
                m = rx.recv(timeout=TIMEOUT)
                t = torch.from_dlpack(m)
                del t
                m.release()
                t1 = time.perf_counter()
                if i >= warm:
                    half.append((t1 - t0) * 1e6 / 2)
            tx.wait_completed(last, timeout=TIMEOUT)
            p50, p99 = stats(half)
            print(f"  {size:>10} {p50:>10.2f} {p99:>10.2f}", flush=True)
            row = {"case": "py_tensor", "size": size, "iters": iters, "p50_us": round(p50, 3), "p99_us": round(p99, 3),
                   "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
            emit(row)
            rows.append(row)
    finally:
        b.join(120)
        if b.is_alive():
            b.kill()
    if b.exitcode != 0:
        raise SystemExit(f"process B failed with exit code {b.exitcode}")
    return rows


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
    rows = []
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
                row = {"case": case, "size": size, "iters": iters, "p50_us": round(p50, 3), "p99_us": round(p99, 3)}
                emit(row)
                rows.append(row)
        q_ba.get(timeout=TIMEOUT)
    finally:
        b.join(60)
        if b.is_alive():
            b.kill()
    return rows


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
    # nvcc takes libraries by -L/-l only: the wheel's library has no plain .so name, hence -l:NAME.
    cmd = [nvcc, "-O2", "-I" + lf.get_include(), "-I" + str(HERE), str(HERE / "lf_cuda_pingpong.cu"),
           "-L" + str(lib.parent), "-l:" + lib.name, "-Xlinker", "-rpath=" + str(lib.parent), "-o", str(out)]
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
              "benchmarks/lf_cuda_pingpong.cu -L$(python3 -c 'import lava_flow as l, os; "
              "print(os.path.dirname(l.get_library()))') -l:liblava_flow.so.0.1 -Xlinker -rpath=<that dir> "
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
    ap.add_argument("--breakdown", action="store_true",
                    help="only time each Python step of the hand-off on both sides (both release modes)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    warm, iters = (args.warm // 4, args.iters // 4) if args.quick else (args.warm, args.iters)
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    if args.breakdown:
        run_breakdown(sizes, warm, iters)
        print("\npython_gpu_handoff: done")
        return
    py_rows = {(r["case"], r["size"]): r for r in run_lf(sizes, warm, iters)}
    try:
        py_rows.update({(r["case"], r["size"]): r for r in run_lf(sizes, warm, iters, on_gpu=True)})
    except TypeError as e:
        print(f"\n== py_*_on_gpu: not available in this lava-flow ({e})")
    tensor_rows = {r["size"]: r for r in run_tensor(sizes, warm, iters)}
    tmp_rows = {} if args.no_tmp else {r["size"]: r for r in run_tmp(sizes, warm, iters) if r["case"] == "tmp_handoff"}
    c_rows = {} if args.no_c else run_c(args, sizes)
    # Python's hand-off against the C path's, measured in this run: at most C + 2 us.
    pairs = [(py + suffix, c) for suffix in ("", "_on_gpu")
             for py, c in (("py_handoff", "c_lf_handoff"), ("py_handoff_ordered", "c_lf_handoff"),
                           ("py_torch_op", "c_lf_gpu_pingpong"))]
    for py_case, c_case in pairs:
        for size in sizes:
            py, c = py_rows.get((py_case, size)), c_rows.get((c_case, size))
            if py and c:
                over = py["p50_us"] - c["p50_us"]
                print(f"{py_case} {size} B: p50 {py['p50_us']:.2f} us, C {c['p50_us']:.2f} us, "
                      f"{over:+.2f} us ({'within' if over <= 2.0 else 'over'} C + 2 us)")
                emit({"case": "py_vs_c", "py_case": py_case, "c_case": c_case, "size": size,
                      "py_p50_us": py["p50_us"], "c_p50_us": c["p50_us"], "over_us": round(over, 3),
                      "within_2us": over <= 2.0})
    # PyTorch's tensors by reference against torch.multiprocessing's: at most 0.05x.
    for size in sizes:
        py, t = tensor_rows.get(size), tmp_rows.get(size)
        if py and t:
            ratio = py["p50_us"] / t["p50_us"]
            print(f"py_tensor {size} B: p50 {py['p50_us']:.2f} us, torch.multiprocessing {t['p50_us']:.2f} us, "
                  f"{ratio:.3f}x ({'within' if ratio <= 0.05 else 'over'} 0.05x)")
            emit({"case": "py_tensor_vs_tmp", "size": size, "py_p50_us": py["p50_us"], "tmp_p50_us": t["p50_us"],
                  "ratio": round(ratio, 4), "within_0_05x": ratio <= 0.05})
    print("\npython_gpu_handoff: done")


if __name__ == "__main__":
    sys.exit(main())
