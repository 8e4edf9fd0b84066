"""Python and C in one library: a Python consumer of a C producer, and a C extension that
shares liblava_flow.so (and its handles) with the lava_flow module."""
import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import lava_flow as lf

CC = shutil.which("cc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc)")

C_PRODUCER = r"""
#include <lava_flow.h>
#include <stdio.h>
#include <string.h>

#define CHECK(call) do { lf_status s_ = (call); if (s_ != LF_OK) { \
    fprintf(stderr, "%s: %s\n", #call, lf_last_error_message()); return 1; } } while (0)

int main(int argc, char **argv) {
    lf_context *ctx = NULL;
    lf_location *here = NULL;
    lf_channel *ch = NULL;
    lf_channel_config cfg;
    CHECK(lf_context_create(NULL, &ctx));
    CHECK(lf_location_detect(&here));
    CHECK(lf_channel_config_init(&cfg, sizeof cfg));
    cfg.capacity = 8;
    CHECK(lf_channel_create(ctx, argv[1], LF_ROLE_PRODUCER, here, here, &cfg, &ch));
    for (int i = 0; i < 100; i++) {
        double v[256];
        for (int k = 0; k < 256; k++) v[k] = i * 1000.0 + k;
        CHECK(lf_send(ch, v, sizeof v, 30000000000LL, NULL));
    }
    lf_loan_region loan;
    CHECK(lf_loan(ch, 4096, 30000000000LL, &loan));
    memset(loan.data, 0x5a, 4096);
    CHECK(lf_publish(ch, &loan, 4096, NULL));
    lf_buffer *buf = NULL;
    void *p = NULL;
    uint64_t seq = 0;
    CHECK(lf_alloc(ctx, 1 << 20, LF_MEMORY_CPU_STANDARD, LF_UNSET, 0, &buf));
    CHECK(lf_buffer_ptr(buf, &p));
    memset(p, 0x33, 1 << 20);
    CHECK(lf_send_buffer(ch, buf, 0, 1 << 20, 30000000000LL, &seq));
    CHECK(lf_wait_completed(ch, seq, 30000000000LL));
    lf_channel_free(ch);
    lf_free(buf);
    lf_location_free(here);
    lf_context_free(ctx);
    return 0;
}
"""

C_EXTENSION = r"""
#include <lava_flow.h>
#include <stdint.h>
/* Functions of a C extension given handles by Python (their .handle). */
uint32_t ext_trim(uintptr_t context) {
    uint64_t n = 0;
    return lf_context_trim((const lf_context *)context, &n);
}
uint32_t ext_buffer_size(uintptr_t buffer, size_t *out) {
    return lf_buffer_size((const lf_buffer *)buffer, out);
}
"""


def compile_c(tmp_path, source, out, *flags):
    src = tmp_path / (out + ".c")
    src.write_text(source)
    exe = tmp_path / out
    subprocess.run([CC, "-std=c11", "-O1", f"-I{lf.get_include()}", str(src), lf.get_library(),
                    "-o", str(exe), *flags], check=True)
    return exe


def test_python_consumer_of_c_producer(tmp_path, name):
    libdir = str(Path(lf.get_library()).parent)
    exe = compile_c(tmp_path, C_PRODUCER, "producer", f"-Wl,-rpath,{libdir}")
    ctx = lf.Context(gpu="disabled")
    p = subprocess.Popen([str(exe), name], stderr=subprocess.PIPE, text=True)
    try:
        ch = lf.consumer(ctx, name)
        for i in range(100):
            with ch.recv(timeout=30) as m:
                a = np.frombuffer(m, dtype=np.float64)
                assert a.ctypes.data == m.address
                assert (a == i * 1000.0 + np.arange(256)).all()
                del a
        with ch.recv(timeout=30) as m:
            assert bytes(m) == b"\x5a" * 4096
        with ch.recv(timeout=30) as m:
            assert m.zero_copy and len(m) == 1 << 20
            t = np.from_dlpack(m)
            assert t.ctypes.data == m.address and (t == 0x33).all()
            del t
        with pytest.raises(lf.PeerGoneError):
            ch.recv(timeout=30)
    finally:
        _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err


def mapped_libraries():
    """The distinct liblava_flow files this process has mapped."""
    files = set()
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 6 and "liblava_flow" in parts[5]:
            files.add(os.path.realpath(parts[5]))
    return files


def test_c_extension_shares_the_library(tmp_path):
    # Linked by the library's full path and with no rpath: the loader finds liblava_flow.so
    # only because the lava_flow module has loaded that SONAME.
    ext = compile_c(tmp_path, C_EXTENSION, "ext.so", "-shared", "-fPIC")
    needed = subprocess.run(["readelf", "-d", str(ext)], capture_output=True, text=True).stdout
    assert f"[{lf._native.SONAME}]" in needed and "RUNPATH" not in needed and "RPATH" not in needed
    lib = ctypes.CDLL(str(ext))
    lib.ext_trim.argtypes = [ctypes.c_size_t]
    lib.ext_buffer_size.argtypes = [ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]
    ctx = lf.Context(gpu="disabled")
    buf = ctx.alloc(12345)
    # One handle table: Python's handles are live handles in C (two copies would say
    # LF_ERR_BAD_HANDLE).
    assert lib.ext_trim(ctx.handle) == lf.Status.OK
    size = ctypes.c_size_t()
    assert lib.ext_buffer_size(buf.handle, ctypes.byref(size)) == lf.Status.OK and size.value == 12345
    assert mapped_libraries() == {os.path.realpath(lf.get_library())}


def test_module_reuses_a_library_loaded_first(tmp_path):
    # An extension loaded before lava_flow brought the library from elsewhere: the module
    # takes that one (by SONAME) instead of loading its own.
    other = tmp_path / "elsewhere"
    other.mkdir()
    copy = other / lf._native.SONAME
    shutil.copy2(lf.get_library(), copy)
    code = (
        "import ctypes, os, sys\n"
        f"ctypes.CDLL({str(copy)!r}, mode=ctypes.RTLD_GLOBAL)\n"
        "import lava_flow as lf\n"
        "maps = {os.path.realpath(l.split()[5]) for l in open('/proc/self/maps') if 'liblava_flow' in l}\n"
        f"assert maps == {{{str(copy)!r}}}, maps\n"
        "assert 'already loaded' in lf.library_path(), lf.library_path()\n"
        "lf.Context(gpu='disabled').alloc(64)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


CXX_EXTENSION = r"""
#include <lava_flow.hpp>
#include <cstdint>
// A C++ extension built with find_package(LavaFlow) from lava_flow.get_cmake_dir().
extern "C" std::uint32_t cxx_buffer_location(std::uintptr_t buffer, std::uint32_t *out) {
    lf_memory_kind kind = LF_MEMORY_CPU_STANDARD;
    const lf_status status = lf_buffer_location(reinterpret_cast<const lf_buffer *>(buffer), &kind);
    *out = static_cast<std::uint32_t>(kind);
    return static_cast<std::uint32_t>(status);
}
"""

CMAKE_LISTS = """
cmake_minimum_required(VERSION 3.16)
project(ext CXX)
find_package(LavaFlow CONFIG REQUIRED)
add_library(cxx_ext SHARED ext.cpp)
set_target_properties(cxx_ext PROPERTIES CXX_STANDARD 17 SKIP_BUILD_RPATH ON)
target_link_libraries(cxx_ext PRIVATE LavaFlow::lava_flow)
"""


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("c++") is None,
                    reason="no cmake or C++ compiler")
def test_cxx_extension_from_the_cmake_package(tmp_path):
    (tmp_path / "ext.cpp").write_text(CXX_EXTENSION)
    (tmp_path / "CMakeLists.txt").write_text(CMAKE_LISTS)
    build = tmp_path / "build"
    subprocess.run(["cmake", "-S", str(tmp_path), "-B", str(build), f"-DLavaFlow_DIR={lf.get_cmake_dir()}"],
                   check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build)], check=True, capture_output=True)
    lib = ctypes.CDLL(str(build / "libcxx_ext.so"))
    lib.cxx_buffer_location.argtypes = [ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint32)]
    buf = lf.Context(gpu="disabled").alloc(64, lf.Memory.CPU_NUMA)
    loc = ctypes.c_uint32()
    assert lib.cxx_buffer_location(buf.handle, ctypes.byref(loc)) == lf.Status.OK
    assert loc.value == buf.location
    assert mapped_libraries() == {os.path.realpath(lf.get_library())}
