"""A 2-stage pipeline with compressed boundaries on Fashion-MNIST (docs/PYTHON.md).

    build/python/run -m torch.distributed.run --standalone --nproc_per_node 2 \\
        examples/python/pipeline_fashion_mnist.py [--forward topk(0.1)] [--backward quant(bits=8)]

Stage 0 (rank 0) is 784 -> 256 -> ReLU, stage 1 (rank 1) 256 -> 128 -> ReLU -> 10; the activations
cross through --forward, the gradients back through --backward, under torch's 1F1B schedule on Gloo.
Prints the bytes each rank sent against the dense tensors', and the test accuracy with compression
on and off at inference.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import Schedule1F1B

import tapeline
from tapeline.data import fashion_mnist
from tapeline.pipelining import CompressedPipelineStage


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--forward", default="topk(0.1)")
    ap.add_argument("--backward", default="quant(bits=8)")
    ap.add_argument("--train", type=int, default=12000, help="training samples (0: all 60000)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--micro", type=int, default=4, help="micro-batches per batch")
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != 2:
        raise SystemExit(f"pipeline_fashion_mnist: run with 2 processes (--nproc_per_node 2), got {world}")
    torch.manual_seed(0)
    parts = [nn.Sequential(nn.Linear(784, 256), nn.ReLU()),
             nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))]
    mod = parts[rank]
    stage = CompressedPipelineStage(mod, rank, 2, torch.device("cpu"), forward=a.forward, backward=a.backward)
    schedule = Schedule1F1B(stage, n_microbatches=a.micro, loss_fn=nn.functional.cross_entropy)
    opt = torch.optim.Adam(mod.parameters(), lr=1e-3)
    x, y = fashion_mnist("train", a.train)
    tx, ty = fashion_mnist("test", 2000)
    t0 = time.time()
    for epoch in range(a.epochs):
        order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(epoch))
        losses = []
        for at in range(0, x.shape[0] - a.batch + 1, a.batch):
            idx = order[at:at + a.batch]
            opt.zero_grad()
            if rank == 0:
                schedule.step(x[idx])
            else:
                schedule.step(target=y[idx], losses=losses)
            opt.step()
        if rank == 1:
            print(f"epoch {epoch + 1}: loss {torch.stack(losses).mean().item():.4f} ({time.time() - t0:.1f} s)", flush=True)
    dense = stage.stats()["out" if rank == 0 else "in"]
    sent = dense["forward" if rank == 0 else "backward"]
    print(f"rank {rank} sent {stage.bytes_sent} payload bytes ({stage.wire_bytes_sent} on the wire) for "
          f"{sent['raw_bytes']} dense bytes: {sent['raw_bytes'] / max(1, stage.bytes_sent):.1f}x less "
          f"({'activations, ' + a.forward if rank == 0 else 'gradients, ' + a.backward})", flush=True)
    stage.eval()
    with torch.no_grad():
        for on in (True, False):
            stage.compress_at_inference = on
            correct = 0
            n = tx.shape[0] - tx.shape[0] % a.batch  # whole batches: the stages' shapes are the training's
            for at in range(0, n, a.batch):
                if rank == 0:
                    schedule.eval(tx[at:at + a.batch])
                else:
                    logits = schedule.eval(target=ty[at:at + a.batch])
                    correct += (logits.argmax(1) == ty[at:at + a.batch]).sum().item()
            stage.wait_sends()
            if rank == 1:
                print(f"test accuracy, compression {'on ' if on else 'off'} at inference: {correct / n:.4f} "
                      f"({n} test samples)", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
