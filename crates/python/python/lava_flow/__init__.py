"""lava-flow: zero-copy data movement between processes, from Python.

Channels carry messages between processes through shared memory; a received message is a
read-only view of the bytes where the producer put them (buffer protocol and DLPack), so
``numpy.frombuffer(msg, dtype)`` or ``numpy.from_dlpack(msg)`` copy nothing. Buffers are
lava-flow memory of every kind (CPU, huge pages, NUMA, GPU-pinned, GPU) that can be sent by
reference or exported to another process.

The package ships liblava_flow.so and calls its C API; C and C++ extensions built against the
same library (``get_include()``, ``get_cmake_dir()``) share its handles with Python
(``.handle`` of Context, Buffer, Channel, Location).

    import lava_flow as lf
    ctx = lf.Context()
    with lf.producer(ctx, "frames") as ch:        # another process: lf.consumer(ctx, "frames")
        ch.send(numpy_array)
"""
from __future__ import annotations

import asyncio
import enum
from pathlib import Path

from . import _native
# lava-flow memory for PyTorch (imports torch only when used).
from . import torch
from ._native import (
    Buffer,
    Context,
    Export,
    InvalidStateError,
    LavaFlowError,
    Loan,
    Location,
    Message,
    Mpi,
    Peer,
    PeerGoneError,
    TimeoutError,
    WouldBlockError,
    _cuda_imports,
    _gpu_releases,
    library_path,
    set_log_level,
    version,
)

__all__ = [
    "Buffer", "Channel", "ChannelKind", "Context", "DeviceType", "Export", "InvalidStateError", "LavaFlowError",
    "Loan", "Location", "LogLevel", "Memory", "Message", "MessageFlags", "Mpi", "Origin",
    "Peer", "PeerGoneError", "Registration", "Role", "Status", "TimeoutError", "Wait", "WouldBlockError",
    "consumer", "get_cmake_dir", "get_include", "get_library", "library_path", "producer",
    "set_log_level", "torch", "version", "__version__",
]

__version__ = version()


class Memory(enum.IntEnum):
    """Memory kinds (LF_MEMORY_*): Context.alloc's `memory`."""

    CPU_STANDARD = _native.LF_MEMORY_CPU_STANDARD
    CPU_NUMA = _native.LF_MEMORY_CPU_NUMA
    CPU_HUGEPAGE_2MB = _native.LF_MEMORY_CPU_HUGEPAGE_2MB
    CPU_HUGEPAGE_1GB = _native.LF_MEMORY_CPU_HUGEPAGE_1GB
    CPU_GPU_PINNED = _native.LF_MEMORY_CPU_GPU_PINNED
    GPU_DEVICE_LOCAL = _native.LF_MEMORY_GPU_DEVICE_LOCAL
    GPU_HOST_VISIBLE = _native.LF_MEMORY_GPU_HOST_VISIBLE


class Origin(enum.IntEnum):
    """How a buffer came to be (Buffer.origin)."""

    ALLOCATED = _native.LF_ORIGIN_ALLOCATED
    REGISTERED = _native.LF_ORIGIN_REGISTERED
    IMPORTED = _native.LF_ORIGIN_IMPORTED


class Registration(enum.IntFlag):
    """GPU APIs GPU-pinned memory is registered with (Buffer.registrations)."""

    VULKAN = _native.LF_REGISTRATION_VULKAN
    CUDA = _native.LF_REGISTRATION_CUDA


class Role(enum.IntEnum):
    """The end of a channel."""

    PRODUCER = _native.LF_ROLE_PRODUCER
    CONSUMER = _native.LF_ROLE_CONSUMER


class Wait(enum.IntEnum):
    """How a channel end waits (Channel's `wait`)."""

    BUSY_POLL = _native.LF_WAIT_BUSY_POLL
    SPIN_THEN_BLOCK = _native.LF_WAIT_SPIN_THEN_BLOCK
    BLOCK = _native.LF_WAIT_BLOCK


class ChannelKind(enum.IntEnum):
    """How many processes share a channel (Channel's `kind`; or "pair", "fan_in", "fan_out").
    Every end names the same kind."""

    PAIR = _native.LF_CHANNEL_PAIR
    """One producer, one consumer (the default)."""
    FAN_IN = _native.LF_CHANNEL_FAN_IN
    """Up to `max_peers` producers, one consumer: each producer's messages in order and exactly
    once, the producers served in turn; Message.producer names the sender's slot."""
    FAN_OUT = _native.LF_CHANNEL_FAN_OUT
    """One producer, up to `max_peers` consumers: each message to every consumer attached when it
    was sent; a consumer that joins late starts with the next message."""


class MessageFlags(enum.IntFlag):
    """Message.flags bits."""

    ZERO_COPY = _native.LF_MESSAGE_ZERO_COPY
    GPU = _native.LF_MESSAGE_GPU


class DeviceType(enum.IntEnum):
    """Context.device_info()['device_type']."""

    OTHER = _native.LF_DEVICE_TYPE_OTHER
    INTEGRATED_GPU = _native.LF_DEVICE_TYPE_INTEGRATED_GPU
    DISCRETE_GPU = _native.LF_DEVICE_TYPE_DISCRETE_GPU
    VIRTUAL_GPU = _native.LF_DEVICE_TYPE_VIRTUAL_GPU
    CPU = _native.LF_DEVICE_TYPE_CPU


class LogLevel(enum.IntEnum):
    """Levels of lava-flow's log records (set_log_level)."""

    OFF = _native.LF_LOG_OFF
    ERROR = _native.LF_LOG_ERROR
    WARN = _native.LF_LOG_WARN
    INFO = _native.LF_LOG_INFO
    DEBUG = _native.LF_LOG_DEBUG
    TRACE = _native.LF_LOG_TRACE


class Status(enum.IntEnum):
    """lf_status values (LavaFlowError.status)."""

    OK = _native.LF_OK
    ERR_INVALID_ARGUMENT = _native.LF_ERR_INVALID_ARGUMENT
    ERR_NULL_POINTER = _native.LF_ERR_NULL_POINTER
    ERR_BAD_HANDLE = _native.LF_ERR_BAD_HANDLE
    ERR_CONFIG = _native.LF_ERR_CONFIG
    ERR_NOT_FOUND = _native.LF_ERR_NOT_FOUND
    ERR_OUT_OF_MEMORY = _native.LF_ERR_OUT_OF_MEMORY
    ERR_UNSUPPORTED = _native.LF_ERR_UNSUPPORTED
    ERR_PERMISSION_DENIED = _native.LF_ERR_PERMISSION_DENIED
    ERR_IO = _native.LF_ERR_IO
    ERR_VULKAN = _native.LF_ERR_VULKAN
    ERR_WOULD_BLOCK = _native.LF_ERR_WOULD_BLOCK
    ERR_TIMEOUT = _native.LF_ERR_TIMEOUT
    ERR_PEER_GONE = _native.LF_ERR_PEER_GONE
    ERR_CORRUPT = _native.LF_ERR_CORRUPT
    ERR_INVALID_STATE = _native.LF_ERR_INVALID_STATE
    ERR_INTERNAL = _native.LF_ERR_INTERNAL


_HERE = Path(__file__).resolve().parent


def get_include() -> str:
    """The directory of lava_flow.h and lava_flow.hpp, for C and C++ extensions."""
    return str(_HERE / "include")


def get_cmake_dir() -> str:
    """The directory of LavaFlowConfig.cmake (``-DLavaFlow_DIR=...``; target LavaFlow::lava_flow)."""
    return str(_HERE / "cmake")


def get_library() -> str:
    """The path of the liblava_flow.so this package ships (link C extensions against it)."""
    return str(_HERE / "lib" / _native.SONAME)


class Channel(_native.Channel):
    __doc__ = _native.Channel.__doc__

    async def recv_async(self, timeout: float | None = None) -> Message:
        """Receives the next message without blocking the event loop (consumers): waits on
        ``fileno()`` with ``loop.add_reader``. Raises TimeoutError after `timeout` seconds."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        fd = self.fileno()
        while True:
            msg = self.try_recv()
            if msg is not None:
                return msg
            ready: asyncio.Future[None] = loop.create_future()

            def wake(ready: asyncio.Future[None] = ready) -> None:
                if not ready.done():
                    ready.set_result(None)

            loop.add_reader(fd, wake)
            try:
                if deadline is None:
                    await ready
                else:
                    await asyncio.wait_for(ready, max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                err = TimeoutError(f"recv_async on channel {self.name!r} timed out after {timeout} s")
                err.status, err.status_name, err.message = _native.LF_ERR_TIMEOUT, "LF_ERR_TIMEOUT", err.args[0]
                raise err from None
            finally:
                loop.remove_reader(fd)

    def _last_end(self) -> bool:
        """After a PeerGoneError: whether it ends iteration. A pair's does; a fan-in's only when
        no producer is left attached (none alive, none gone with messages still to read)."""
        if self.kind != ChannelKind.FAN_IN:
            return True
        return all(p.state == "free" for p in self.peers())

    def __aiter__(self):
        return self

    async def __anext__(self) -> Message:
        """``async for msg in channel``: each message until the producer has gone (on a fan-in:
        until a producer's end leaves none attached; see __iter__)."""
        while True:
            try:
                return await self.recv_async()
            except PeerGoneError:
                if self._last_end():
                    raise StopAsyncIteration from None

    def __iter__(self):
        """``for msg in channel``: each message until the producer has gone. On a fan-in, the
        ends of producers pass while others are attached, and iteration stops when a producer's
        end leaves none attached; a producer that attaches only later is not waited for (to
        wait for a known number of producers, call recv and count the PeerGoneErrors)."""
        while True:
            try:
                yield self.recv()
            except PeerGoneError:
                if self._last_end():
                    return


def producer(context: Context, name: str, **config) -> Channel:
    """The producer end of channel `name` (waits for the consumer; see Channel). A fan-in
    producer (``kind="fan_in"``) takes the lowest free slot; one of a full fan-in is refused
    (InvalidStateError, naming max_peers). A fan-out producer (``kind="fan_out"``) waits for
    its first consumer; the others attach at any time."""
    return Channel(context, name, "producer", **config)


def consumer(context: Context, name: str, **config) -> Channel:
    """The consumer end of channel `name` (waits for the producer; see Channel). A consumer of
    a full fan-out is refused (InvalidStateError, naming max_peers)."""
    return Channel(context, name, "consumer", **config)
