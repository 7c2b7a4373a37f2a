"""pytest configuration of tests/python: the tapeline package from the build (build/python/run puts
it on PYTHONPATH; scripts/test runs `build/python/run -m pytest tests/python`)."""
import os
import pathlib
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import tapeline
from tapeline.ddp import pack_payloads, unpack_payloads

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


def _gloo_rank(rank, world, port, fn, path):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.save(fn(rank), os.path.join(path, f"rank{rank}.pt"))
    dist.destroy_process_group()
    # Note [spawned ranks leave without finalizing]. A Gloo worker thread may still hold the last
    # reference to a finished collective (its tensors' Python objects, a comm hook's `then`
    # callback) when the main thread gets here. Once DistributedDataParallel has been built, the
    # process group outlives destroy_process_group() and gc, so its threads are never joined; if
    # one of them drops such a reference while the interpreter is finalizing, taking the GIL ends
    # that thread inside C++ and the rank aborts ("terminate called without an active exception";
    # about 1 exit in 17 here: the core dumps show ProcessGroupGloo::runLoop releasing an
    # all-gather's work, or a future's Python callback, under Py_FinalizeEx). The result is saved
    # and the group destroyed, so the rank ends here, without finalizing the interpreter.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def gloo_ranks(fn, out_dir: pathlib.Path, world: int = 2):
    """Runs fn(rank) in `world` spawned processes joined in a Gloo group (one thread each) and
    returns their results by rank (fn: a module-level function; its result goes through torch.save)."""
    mp.start_processes(_gloo_rank, args=(world, free_port(), fn, str(out_dir)), nprocs=world, start_method="spawn")
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(world)]


def cpp_dp_sum(interop, spec, grads_by_rank, d):
    """Runs DataParallelSync::reduce_gradients on 2 C++ ranks over c10d for the given gradients."""
    ident = tapeline.Codec("identity")
    port, procs = free_port(), []
    for r, grads in enumerate(grads_by_rank):
        (d / f"in{r}.bin").write_bytes(pack_payloads([ident.encode(g) for g in grads]).numpy().tobytes())
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([interop, "dp-sum", spec, str(d / f"in{r}.bin"), str(d / f"out{r}.bin")], env=env))
    for p in procs:
        assert p.wait(timeout=120) == 0
    return [[ident.decode(p) for p in
             unpack_payloads(torch.frombuffer(bytearray((d / f"out{r}.bin").read_bytes()), dtype=torch.uint8))]
            for r in range(2)]
