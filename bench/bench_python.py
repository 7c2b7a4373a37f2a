"""bench_python: what the Python package costs over the C++ toolkit (docs/PYTHON.md, "Benchmark").

    build/python/run bench/bench_python.py [--repeats N] [--inner N] [--max-mib M] [--no-pipeline]

1. A codec called from Python (tapeline.Codec: encode, then decode) against the same codec called
   in C++ on the same tensor in the same process (tapeline._C._time_codec: the library's own calls
   in a C++ loop), for float32 tensors of 64 KiB to 16 MiB. Both sides run the same loop (a
   warm-up pair, then --inner timed pairs), alternately for --repeats rounds, so machine load drifts
   hit both; python_us and cpp_us: the best encode, decode and pair; overhead = python pair / C++
   pair - 1, overhead_us their difference. One JSON line per codec and size.
2. The compressed pipeline stage against torch's own stage on loopback: 2 Gloo processes, a 2-stage
   MLP, Schedule1F1B; seconds per step (best of --repeats) of torch's PipelineStage,
   CompressedPipelineStage with the identity codec and with topk(0.1) / quant(bits=8), the ratio to
   torch's, and the bytes each sent.
"""
import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import tapeline


def python_pairs(c, x, repeats):
    """The loop _C._time_codec runs in C++, from Python: one warm-up pair, then `repeats` timed
    encode + decode pairs, each pair's outputs freed after its clock stops (as the C++ loop's scope
    ends after its own); the best encode, decode and pair."""
    best_enc = best_dec = best_pair = 1e30
    for r in range(repeats + 1):
        t0 = time.perf_counter()
        p = c.encode(x)
        t1 = time.perf_counter()
        y = c.decode(p)
        t2 = time.perf_counter()
        del p, y
        if r:
            best_enc, best_dec, best_pair = min(best_enc, t1 - t0), min(best_dec, t2 - t1), min(best_pair, t2 - t0)
    return best_enc, best_dec, best_pair


def codec_rows(specs, rounds, inner, max_mib):
    size = 64 << 10
    while size <= max_mib << 20:
        x = torch.randn(64, size // 4 // 64)
        for spec in specs:
            c = tapeline.Codec(spec)
            py, cpp = [1e30] * 3, [1e30] * 3
            for _ in range(rounds):  # Python and C++ alternate: load drifts reach both
                py = [min(a, b) for a, b in zip(py, python_pairs(c, x, inner))]
                cpp = [min(a, b) for a, b in zip(cpp, tapeline._C._time_codec(spec, x, inner))]
            print(json.dumps({"bench": "python_codec", "codec": spec, "bytes": size,
                              "python_us": [round(t * 1e6, 2) for t in py], "cpp_us": [round(t * 1e6, 2) for t in cpp],
                              "overhead_us": round((py[2] - cpp[2]) * 1e6, 2), "overhead": round(py[2] / cpp[2] - 1, 4),
                              "payload_bytes": c.encode(x).nbytes}), flush=True)
        size *= 4


def stage_worker(rank, port, repeats, out):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    from tapeline.pipelining import CompressedPipelineStage
    width, batch, micro = 1024, 256, 4  # activations of (64, 1024) float32: 256 KiB per micro-batch
    x, y = torch.randn(batch, width), torch.randint(0, 10, (batch,))
    kinds = [("torch", lambda m: PipelineStage(m, rank, 2, torch.device("cpu"))),
             ("identity", lambda m: CompressedPipelineStage(m, rank, 2, torch.device("cpu"))),
             ("topk(0.1)/quant(bits=8)", lambda m: CompressedPipelineStage(
                 m, rank, 2, torch.device("cpu"), forward="topk(0.1)", backward="quant(bits=8)"))]
    times = {name: 1e30 for name, _ in kinds}
    sent = {}
    stages = {}
    for name, make in kinds:
        torch.manual_seed(0)
        mod = [nn.Sequential(nn.Linear(width, width), nn.ReLU()), nn.Linear(width, 10)][rank]
        stages[name] = (make(mod), mod)
    for _ in range(repeats + 1):  # the kinds alternate within each round
        for name, _ in kinds:
            stage, mod = stages[name]
            sched = Schedule1F1B(stage, n_microbatches=micro, loss_fn=nn.functional.cross_entropy)
            if hasattr(stage, "reset_stats"):
                stage.reset_stats()  # bytes of one step
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                sched.step(x)
            else:
                sched.step(target=y)
            dist.barrier()
            times[name] = min(times[name], time.perf_counter() - t0)
            sent[name] = getattr(stage, "bytes_sent", None)
    if rank == 0:
        torch.save(dict(times=times, sent=sent), out)
    dist.destroy_process_group()


def stage_rows(repeats):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = f"/tmp/bench_python_{os.getpid()}.pt"
    mp.start_processes(stage_worker, args=(port, repeats, out), nprocs=2, start_method="spawn")
    r = torch.load(out)
    os.unlink(out)
    base = r["times"]["torch"]
    for name, t in r["times"].items():
        print(json.dumps({"bench": "python_stage", "stage": name, "step_ms": round(t * 1e3, 3),
                          "ratio_to_torch": round(t / base, 3), "rank0_bytes_per_step": r["sent"][name],
                          "dense_bytes_per_step": 4 * 64 * 1024 * 4}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7, help="rounds (codecs) and timed steps (pipeline)")
    ap.add_argument("--inner", type=int, default=20, help="timed encode + decode pairs per round and side")
    ap.add_argument("--max-mib", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-pipeline", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    codec_rows(["fp16", "quant(bits=8)", "topk(0.1)", "ef(topk(0.1))"], a.repeats, a.inner, a.max_mib)
    if not a.no_pipeline:
        stage_rows(a.repeats)


if __name__ == "__main__":
    main()
