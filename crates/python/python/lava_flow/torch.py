"""lava-flow memory for PyTorch: tensors whose bytes are lava-flow GPU buffers.

``mem_pool(device)`` returns a ``torch.cuda.MemPool`` over lava-flow's allocator: tensors made
under ``torch.cuda.use_mem_pool(pool)`` lie in lava-flow GPU memory (Vulkan DEVICE_LOCAL
memory, which Vulkan, OpenCL, OpenGL and CUDA consumers can all open). ``send_tensor`` sends
such a tensor as its lava-flow buffer, so that any consumer gets an ordinary GPU message
(``msg.buffer``; DLPack to torch or CuPy); ``buffer_of(tensor)`` gives that buffer.

    import torch
    import lava_flow as lf
    import lava_flow.torch

    ctx = lf.Context(gpu="required")
    pool = lf.torch.mem_pool(0, context=ctx)
    with torch.cuda.use_mem_pool(pool):
        t = torch.ones(1 << 20, device="cuda:0")
    with lf.producer(ctx, "frames") as ch:
        ch.send_tensor(t)              # by reference, as a lava-flow GPU buffer

PyTorch's allocator hooks say which device an allocation is for, not which pool: each CUDA
device is served by one Context in a process (the one its first pool was made with), and
every pool of that device allocates from it. PyTorch gives pool memory back when the pool is
gone and its cache is emptied (``del pool; torch.cuda.empty_cache()``). Where lava-flow
refuses an allocation, PyTorch raises ``torch.OutOfMemoryError``; ``last_error()`` and
lava-flow's log say why. Needs PyTorch 2.8 or newer with CUDA; torch is imported at the
first call, not with this module.
"""
from __future__ import annotations

import re
from typing import Any

from . import _native
from ._native import Buffer, Context

__all__ = ["MIN_TORCH", "buffer_of", "context", "device_uuid", "last_error", "mem_pool"]

MIN_TORCH = (2, 8)
"""The oldest PyTorch whose pools lava-flow serves: from 2.8 on, PyTorch frees a pool's memory
through the pool's own allocator wherever it is freed; before, memory freed outside the pool's
``use_mem_pool`` block went to ``cudaFree``, which cannot free lava-flow's memory."""

_allocator: Any = None


def _torch() -> Any:
    """PyTorch, checked: new enough to give pools a custom allocator, and with CUDA."""
    try:
        import torch
    except ImportError as e:
        raise ImportError(
            "lava_flow.torch needs PyTorch (%d.%d or newer, with CUDA): pip install torch" % MIN_TORCH
        ) from e
    found = re.match(r"(\d+)\.(\d+)", str(getattr(torch, "__version__", "")))
    version = (int(found[1]), int(found[2])) if found else (0, 0)
    cuda = getattr(torch, "cuda", None)
    memory = getattr(cuda, "memory", None)
    if version < MIN_TORCH or not hasattr(cuda, "MemPool") or not hasattr(memory, "CUDAPluggableAllocator"):
        raise RuntimeError(
            "lava_flow.torch needs PyTorch %d.%d or newer (torch.cuda.MemPool over a pluggable allocator, "
            "freed through that allocator); this is PyTorch %s: upgrade it (pip install -U torch)"
            % (*MIN_TORCH, getattr(torch, "__version__", "") or "of unknown version")
        )
    if not cuda.is_available():
        raise RuntimeError(
            "lava_flow.torch gives PyTorch CUDA memory, and PyTorch sees no CUDA device here "
            "(torch.cuda.is_available() is False): install a CUDA build of PyTorch, and check the "
            "driver and CUDA_VISIBLE_DEVICES"
        )
    return torch


def _device_index(torch: Any, device: Any) -> int:
    """The CUDA device ordinal of `device` (None: the current one; an int; "cuda:N"; a
    torch.device)."""
    if device is None:
        return int(torch.cuda.current_device())
    if isinstance(device, int):
        return device
    d = torch.device(device)
    if d.type != "cuda":
        raise ValueError(f"lava_flow.torch pools hold CUDA memory: device {device!r} is not a CUDA device")
    return int(torch.cuda.current_device()) if d.index is None else int(d.index)


def _pluggable(torch: Any) -> Any:
    """PyTorch's allocator over this module's hooks, made once per process."""
    global _allocator
    if _allocator is None:
        _allocator = torch.cuda.memory.CUDAPluggableAllocator(_native.__file__, _native._TORCH_ALLOC,
                                                               _native._TORCH_FREE)
    return _allocator


def device_uuid(device: Any = None) -> bytes:
    """The 16-byte UUID of CUDA device `device` (as `mem_pool`'s), for
    ``Context(gpu_device=...)``."""
    return _native._cuda_device_uuid(_device_index(_torch(), device))


def mem_pool(device: Any = None, *, context: Context | None = None) -> Any:
    """A ``torch.cuda.MemPool`` whose memory is lava-flow GPU memory of CUDA device `device`
    (None: the current device; an int, "cuda:N" or a torch.device).

    `context`: the Context to allocate from, whose GPU must be that device (checked by UUID);
    send pool tensors on channels of the same Context. None: the Context already serving the
    device in this process, else a new ``Context(gpu="required")`` on it (``context(device)``
    returns it). A device served by one Context refuses another (InvalidStateError).
    """
    torch = _torch()
    index = _device_index(torch, device)
    if context is None:
        context = _native._torch_pool_context(index)
    if context is None:
        context = Context(gpu="required", gpu_device=_native._cuda_device_uuid(index))
    _native._torch_pool_bind(context, index)
    return torch.cuda.MemPool(_pluggable(torch).allocator())


def context(device: Any = None) -> Context | None:
    """The Context whose memory the pools of CUDA device `device` give PyTorch, or None where
    no pool was made for it."""
    return _native._torch_pool_context(_device_index(_torch(), device))


def buffer_of(tensor: Any) -> tuple[Buffer, int] | None:
    """The lava-flow Buffer that holds `tensor`'s bytes and the offset of its first byte in it,
    or None where the tensor is not in a lava-flow pool's memory. The Buffer keeps the memory
    alive while it lives (free() it, or let it go, when done); send the tensor's bytes with
    ``channel.send_buffer(buffer, offset, tensor.nbytes)`` (``send_tensor(tensor)`` does that
    and keeps the tensor until the consumer released it: with send_buffer, keep it yourself
    until ``wait_completed``)."""
    return _native._torch_buffer_of(int(tensor.data_ptr()))


def last_error() -> str | None:
    """Why lava-flow's allocator last refused PyTorch (PyTorch reports it as out of memory),
    or None if it never did."""
    return _native._torch_pool_last_error()


def _stats() -> dict[str, int]:
    """For tests and diagnostics: pool buffers alive and their bytes, arenas imported into CUDA
    now, allocations and frees so far."""
    return _native._torch_pool_stats()
