"""The PEP 517 build backend of lava_flow: maturin's, preceded by the build of the C library.

The wheel ships liblava_flow.so (the C API, built by cargo from the workspace's lava-flow-c
package) beside the extension module, which opens it at import; with it the headers and a
CMake package, so that C and C++ extensions build against that same library
(lava_flow.get_include(), lava_flow.get_cmake_dir()). Environment:
  LAVA_FLOW_FEATURES  cargo features of the library (e.g. "mpi"); default: vulkan.
"""
import json
import os
import shutil
import subprocess
from pathlib import Path

import maturin
from maturin import (  # noqa: F401  (the hooks pip calls, as maturin has them)
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

HERE = Path(__file__).resolve().parent.parent
ROOT = HERE.parent.parent
PACKAGE = HERE / "python" / "lava_flow"


def build_library():
    features = os.environ.get("LAVA_FLOW_FEATURES", "").strip()
    cmd = ["cargo", "build", "--release", "--locked", "-p", "lava-flow-c",
           "--manifest-path", str(ROOT / "Cargo.toml"), "--message-format=json-render-diagnostics"]
    if features:
        cmd += ["--features", features]
    print("lava_flow: building the C library:", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    library, version = None, None
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or msg["target"]["name"] != "lava_flow":
            continue
        for f in msg["filenames"]:
            if f.endswith("/liblava_flow.so"):
                library = Path(f)
                version = msg["package_id"].rsplit("@", 1)[-1].rsplit("#", 1)[-1]
    if library is None:
        raise RuntimeError("cargo built no liblava_flow.so (see the output above)")
    major, minor = version.split(".")[:2]
    soname = f"liblava_flow.so.{major}" if major != "0" else f"liblava_flow.so.0.{minor}"
    lib = PACKAGE / "lib"
    shutil.rmtree(lib, ignore_errors=True)
    lib.mkdir(parents=True)
    shutil.copy2(library, lib / soname)
    include = PACKAGE / "include"
    shutil.rmtree(include, ignore_errors=True)
    include.mkdir(parents=True)
    for h in ("lava_flow.h", "lava_flow.hpp"):
        shutil.copy2(ROOT / "include" / h, include / h)
    # The C++ wrapper's parts, which lava_flow.hpp includes.
    shutil.copytree(ROOT / "include" / "lava_flow", include / "lava_flow")
    enabled = {"vulkan"} | {f.strip() for f in features.replace(",", " ").split()}
    (include / "lava_flow_features.h").write_text(
        "/* What the lava_flow wheel's liblava_flow.so was built with. */\n"
        "#pragma once\n"
        f"#define LAVA_FLOW_FEATURE_VULKAN {int('vulkan' in enabled)}\n"
        f"#define LAVA_FLOW_FEATURE_MPI {int('mpi' in enabled)}\n")


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    build_library()
    return maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    build_library()
    return maturin.build_editable(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    raise RuntimeError("lava_flow is built from the repository (pip install ./crates/python): "
                       "the library it ships is the whole workspace, which an sdist of this "
                       "directory would not hold")
