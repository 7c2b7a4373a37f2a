"""DistributedDataParallel with a compressed gradient hook on Fashion-MNIST (docs/PYTHON.md).

    build/python/run -m torch.distributed.run --standalone --nproc_per_node 2 \\
        examples/python/ddp_fashion_mnist.py [--codec "ef(powersgd(rank=4))"] [--fsdp]

Each rank trains an MLP (784 -> 256 -> 128 -> 10) on its half of the training samples; DDP's
gradient all-reduce goes through tapeline.ddp_comm_hook (the C++ grid's compressed data-parallel
sum). --fsdp: FSDP2 instead (fully_shard on the shard dimension of a (ranks, 1) CPU mesh, the
replicas' all-reduce through tapeline.fsdp_all_reduce_hook). Prints the bytes each rank sent against
the raw gradients', and the test accuracy.
"""
import argparse
import time

import torch
import torch.distributed as dist
from torch import nn

import tapeline
from tapeline.data import fashion_mnist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--codec", default="ef(powersgd(rank=4))")
    ap.add_argument("--train", type=int, default=12000, help="training samples (0: all 60000)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64, help="per rank")
    ap.add_argument("--fsdp", action="store_true", help="FSDP2 with tapeline.fsdp_all_reduce_hook instead of DDP")
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    if a.fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("replicate", "shard"))
        for layer in model[::2]:
            fully_shard(layer, mesh=mesh["shard"])
        ddp = fully_shard(model, mesh=mesh["shard"])
        state = tapeline.fsdp_all_reduce_hook(model, a.codec, mesh["replicate"].get_group())
    else:
        ddp = nn.parallel.DistributedDataParallel(model)
        state, hook = tapeline.ddp_comm_hook(a.codec)
        ddp.register_comm_hook(state, hook)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    x, y = fashion_mnist("train", a.train)
    x, y = x[rank::world], y[rank::world]
    tx, ty = fashion_mnist("test", 2000)
    t0 = time.time()
    for epoch in range(a.epochs):
        order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(epoch))
        total = 0.0
        for at in range(0, x.shape[0] - a.batch + 1, a.batch):
            idx = order[at:at + a.batch]
            loss = nn.functional.cross_entropy(ddp(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        if rank == 0:
            print(f"epoch {epoch + 1}: loss {total / x.shape[0]:.4f} ({time.time() - t0:.1f} s)", flush=True)
    print(f"rank {rank} sent {state.bytes} payload bytes for {state.raw_bytes} raw gradient bytes: "
          f"{state.raw_bytes / max(1, state.bytes):.1f}x less ({a.codec}; {state.padded_bytes} bytes moved by the "
          f"all-gather with padding)", flush=True)
    with torch.no_grad():
        acc = (model(tx).argmax(1) == ty).float().mean().item()
    if rank == 0:
        print(f"test accuracy: {acc:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
