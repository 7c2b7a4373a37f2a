"""The peer of bench_pipeline's 4-process GPT-2 row: torch.distributed.pipelining's Schedule1F1B.

The same model as bench/pipeline/workloads.cpp's gpt2_4x256 (4 blocks of width 256, 4 heads,
vocabulary 256, context 64, no dropout), the same batch (32 sequences of 64 tokens) in 8
micro-batches, the same cuts (after h.0, h.1 and h.2), 4 processes over Gloo, 1 thread each.
One difference: PyTorch's pipelining has no tied parameters across stages, so the output head is
its own matrix here, where tapeline ties it to the token embedding and sums the two gradients
(one more all-reduce per step for tapeline). Prints one JSON line on rank 0:
  {"bench":"peer_pipeline_torch","torch":...,"steps":N,"step_s":median,"step_s_all":[...]}
Run: PYTHONPATH=<the 2.15 wheel> python3 torch_pipelining_gpt2.py [--steps N] [--port P]
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

VOCAB, CTX, WIDTH, LAYERS, HEADS, BATCH, MICRO = 256, 64, 256, 4, 4, 32, 8


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.fc, self.out = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):  # (B, T, C)
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))  # (B, H, T, C/H)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class Stage(nn.Module):
    def __init__(self, index):
        super().__init__()
        self.index = index
        if index == 0:
            self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(CTX, WIDTH)
        self.blocks = nn.ModuleList([Block() for _ in range(2 if index == 3 else 1)])
        if index == 3:
            self.ln_f, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, x):
        if self.index == 0:
            x = self.wte(x) + self.wpe(torch.arange(x.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x)) if self.index == 3 else x


def loss_fn(logits, target):  # (B, T, V), (B, T)
    return F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))


def run(rank, world, steps, port, out):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(2 + rank)
    module = Stage(rank)
    # Static shapes (no metadata exchange, which needs numpy): a micro-batch of 4 sequences.
    mb = BATCH // MICRO
    act = torch.zeros(mb, CTX, WIDTH)
    x_in = torch.zeros(mb, CTX, dtype=torch.long) if rank == 0 else act
    y_out = torch.zeros(mb, CTX, VOCAB) if rank == world - 1 else act
    stage = PipelineStage(module, rank, world, torch.device("cpu"), input_args=x_in, output_args=y_out,
                          input_grads=None if rank == 0 else act, output_grads=y_out)
    schedule = Schedule1F1B(stage, MICRO, loss_fn=loss_fn)
    g = torch.Generator().manual_seed(12)
    tokens = torch.randint(VOCAB, (BATCH, CTX), generator=g)
    target = torch.randint(VOCAB, (BATCH, CTX), generator=g)
    times = []
    for step in range(steps + 1):  # the first step warms up (shapes, buffers)
        module.zero_grad()
        dist.barrier()
        t0 = time.perf_counter()
        if rank == 0:
            schedule.step(tokens)
        elif rank == world - 1:
            schedule.step(target=target, losses=[])
        else:
            schedule.step()
        if step > 0:  # forward and backward of the 8 micro-batches, no optimizer: as bench_pipeline's rows
            times.append(time.perf_counter() - t0)
    if rank == 0:
        line = {"bench": "peer_pipeline_torch", "torch": torch.__version__, "steps": steps,
                "step_s": statistics.median(times), "step_s_all": [round(t, 5) for t in times]}
        with open(out, "w") as f:
            f.write(json.dumps(line) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--port", type=int, default=29611)
    ap.add_argument("--out", default="/dev/stdout")
    a = ap.parse_args()
    tmp = a.out if a.out != "/dev/stdout" else f"/tmp/peer_pipeline_{os.getpid()}.json"
    mp.spawn(run, args=(4, a.steps, a.port, tmp), nprocs=4, join=True)
    if a.out == "/dev/stdout":
        sys.stdout.write(open(tmp).read())
        os.remove(tmp)
