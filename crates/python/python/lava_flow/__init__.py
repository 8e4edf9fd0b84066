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
    PeerGoneError,
    TimeoutError,
    WouldBlockError,
    library_path,
    set_log_level,
    version,
)

__all__ = [
    "Buffer", "Channel", "Context", "DeviceType", "Export", "InvalidStateError", "LavaFlowError",
    "Loan", "Location", "LogLevel", "Memory", "Message", "MessageFlags", "Mpi", "Origin",
    "PeerGoneError", "Registration", "Role", "Status", "TimeoutError", "Wait", "WouldBlockError",
    "consumer", "get_cmake_dir", "get_include", "get_library", "library_path", "producer",
    "set_log_level", "version", "__version__",
]

__version__ = version()


def _enum(name, prefix, base=enum.IntEnum, doc=""):
    members = {k[len(prefix):]: getattr(_native, k) for k in dir(_native) if k.startswith(prefix)}
    cls = base(name, members, module=__name__)
    cls.__doc__ = doc
    return cls


Memory = _enum("Memory", "LF_MEMORY_", doc="Memory kinds (LF_MEMORY_*): Context.alloc's `memory`.")
Origin = _enum("Origin", "LF_ORIGIN_", doc="How a buffer came to be (Buffer.origin).")
Registration = _enum("Registration", "LF_REGISTRATION_", enum.IntFlag,
                     "GPU APIs GPU-pinned memory is registered with (Buffer.registrations).")
Role = _enum("Role", "LF_ROLE_", doc="The end of a channel.")
Wait = _enum("Wait", "LF_WAIT_", doc="How a channel end waits (Channel's `wait`).")
MessageFlags = _enum("MessageFlags", "LF_MESSAGE_", enum.IntFlag, "Message.flags bits.")
DeviceType = _enum("DeviceType", "LF_DEVICE_TYPE_", doc="device_info()['device_type'].")
LogLevel = _enum("LogLevel", "LF_LOG_", doc="Levels of lava-flow's log records (set_log_level).")
Status = enum.IntEnum("Status", {k[3:]: getattr(_native, k) for k in dir(_native)
                                 if k == "LF_OK" or k.startswith("LF_ERR_")}, module=__name__)
Status.__doc__ = "lf_status values (LavaFlowError.status)."

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
            ready = loop.create_future()
            loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
            try:
                if deadline is None:
                    await ready
                else:
                    await asyncio.wait_for(ready, max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                err = TimeoutError(f"recv_async on channel {self.name!r} timed out after {timeout} s")
                err.status, err.status_name, err.message = Status.ERR_TIMEOUT, "LF_ERR_TIMEOUT", err.args[0]
                raise err from None
            finally:
                loop.remove_reader(fd)

    def __aiter__(self):
        return self

    async def __anext__(self) -> Message:
        """``async for msg in channel``: each message until the producer has gone."""
        try:
            return await self.recv_async()
        except PeerGoneError:
            raise StopAsyncIteration from None

    def __iter__(self):
        """``for msg in channel``: each message until the producer has gone."""
        while True:
            try:
                yield self.recv()
            except PeerGoneError:
                return


def producer(context: Context, name: str, **config) -> Channel:
    """The producer end of channel `name` (waits for the consumer; see Channel)."""
    return Channel(context, name, "producer", **config)


def consumer(context: Context, name: str, **config) -> Channel:
    """The consumer end of channel `name` (waits for the producer; see Channel)."""
    return Channel(context, name, "consumer", **config)
