"""pytest configuration of tests/python: the tapeline package from the build (build/python/run puts
it on PYTHONPATH; scripts/test runs `build/python/run -m pytest tests/python`)."""
import os
import pathlib
import shutil
import socket

import pytest
import torch

# The tests' tensors are tiny: one thread. An intra-op pool on a busy machine costs far more than
# the work (a 64 x 32 step took 200 ms with 2 threads among other builds, 1 ms with one).
torch.set_num_threads(1)

ROOT = pathlib.Path(__file__).resolve().parents[2]


def build_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("TAPELINE_BUILD_DIR", ROOT / "build")).resolve()


@pytest.fixture(scope="session")
def interop():
    """The C++ side of the interop tests (python/src/interop.cpp)."""
    exe = build_dir() / "python" / "tapeline_py_interop"
    if not exe.is_file():
        pytest.fail(f"{exe} is missing: build the target tapeline_py_interop (scripts/build --target tapeline_py_interop)")
    return str(exe)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
