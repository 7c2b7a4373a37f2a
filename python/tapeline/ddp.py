"""tapeline.ddp_comm_hook: compressed gradients for DistributedDataParallel.register_comm_hook.

Note [DDP hook = the grid's data-parallel sum]. The hook does what the C++ grid's data-parallel
sum does (parallel/ranks/data_parallel.h, Note [all-reduce by all-gather of payloads]): each rank
encodes each parameter's gradient with its own codec (a gradient viewed as the matrix (shape[0],
the rest); parameters of fewer than 2 dims go uncompressed), the payloads of a bucket travel as one
message in the grid's layout (int64 count, int64 length of each, the payloads back to back), every
rank gathers every rank's message, decodes all of them and sums them in rank order 0, 1, ... (so
every rank holds the bitwise same sum), then divides by the world size, as DDP's own all-reduce
does (DDP averages the ranks' gradients; the grid's loss is already a mean over every replica's
batch, so it sums). Codecs whose decoder keeps state per sender or that need sample ids (ef21,
aqsgd) are refused, with the grid's reason.
"""
from collections import OrderedDict
from typing import Optional

import torch
import torch.distributed as dist

from . import _C
from .codec import Codec

_IDENTITY = _C._Codec("identity")  # stateless: the uncompressed messages


def pack_payloads(payloads) -> torch.Tensor:
    """Payloads as one uint8 message: count, each one's length, then their bytes (the grid's layout)."""
    lengths = torch.tensor([len(payloads)] + [p.nbytes for p in payloads], dtype=torch.int64)
    return torch.cat([lengths.view(torch.uint8)] + [p.to_tensor() for p in payloads])


def unpack_payloads(message: torch.Tensor):
    """The payloads of a pack_payloads message (a corrupt one raises RuntimeError saying why)."""
    if message.numel() < 8:
        raise RuntimeError(f"payload message of {message.numel()} bytes: shorter than its count")
    count = int(message[:8].view(torch.int64).item())
    head = 8 * (1 + count)
    if count < 0 or head > message.numel():
        raise RuntimeError(f"payload message of {message.numel()} bytes announces {count} payloads")
    lengths = message[8:head].view(torch.int64).tolist()
    if head + sum(lengths) != message.numel():
        raise RuntimeError(f"payload message of {message.numel()} bytes: its payloads' lengths add up to "
                           f"{head + sum(lengths)}")
    out, at = [], head
    for n in lengths:
        out.append(_C.Payload.from_tensor(message[at:at + n]))
        at += n
    return out


class _CompressedSumState:
    """What both hooks keep: the spec (checked as the grid checks it), one codec per parameter, the
    group, and the bytes this rank sent."""

    def __init__(self, spec: str, process_group: Optional[dist.ProcessGroup], who: str):
        problem = _C.dp_codec_problem(spec)  # ValueError when the spec does not parse
        if problem:
            raise ValueError(f"{who}: '{spec}' cannot compress data-parallel gradients: {problem}")
        self.spec = spec
        self.process_group = process_group
        self._codecs = {}  # parameter's key -> Codec
        self.messages = 0
        self.bytes = 0  # payload bytes sent to the other ranks (as the grid counts them)
        self.raw_bytes = 0  # what the same gradients are uncompressed
        self.padded_bytes = 0  # what the all-gather moved out of this rank (messages padded to the longest)

    def reset_stats(self) -> None:
        self.messages = self.bytes = self.raw_bytes = self.padded_bytes = 0


class DDPCommState(_CompressedSumState):
    """The hook's state: one codec per parameter, grouped by DDP bucket (a bucket's codecs are
    rebuilt, keeping those of parameters it already had, when DDP rebuilds its buckets after the
    first iteration), and the bytes this rank sent."""

    def __init__(self, spec: str, process_group: Optional[dist.ProcessGroup] = None):
        super().__init__(spec, process_group, "ddp_comm_hook")
        self._buckets = {}  # bucket index -> [data_ptr]

    def codecs_for(self, bucket):
        ptrs = [p.data_ptr() for p in bucket.parameters()]
        self._buckets[bucket.index()] = ptrs
        return [self._codecs.setdefault(ptr, Codec(self.spec)) for ptr in ptrs]

    def state_dict(self) -> "OrderedDict[str, torch.Tensor]":
        """Every codec's state, keyed "bucket<i>.<j>.<entry>" (parameter j of bucket i)."""
        out = OrderedDict()
        for b in sorted(self._buckets):
            for j, ptr in enumerate(self._buckets[b]):
                for k, v in self._codecs[ptr].state_dict().items():
                    out[f"bucket{b}.{j}.{k}"] = v
        return out


def _as_matrix(g: torch.Tensor) -> torch.Tensor:
    return g.reshape(g.shape[0], -1) if g.dim() >= 2 else g


class _Exchange:
    """One compressed all-reduce of a list of gradients over `group` (Note [DDP hook = the grid's
    data-parallel sum]): each one encoded by its codec (None: uncompressed), the payloads packed in
    one message, every rank's message gathered (padded to the longest), decoded and summed in rank
    order, divided by the world size. Shared by the DDP hook (one bucket) and the FSDP2 hook
    (tapeline/fsdp.py: one parameter group's shard); `state` takes the byte counts."""

    def __init__(self, state, grads, codecs, group, async_op: bool):
        self.grads, self.codecs = grads, codecs
        self.world = dist.get_world_size(group)
        payloads = [(c if c is not None else _IDENTITY).encode(_as_matrix(g.detach()))
                    for g, c in zip(grads, codecs)]
        mine = pack_payloads(payloads).to(grads[0].device)
        state.messages += 1
        state.bytes += (self.world - 1) * mine.numel()
        state.raw_bytes += (self.world - 1) * sum(g.numel() * g.element_size() for g in grads)
        # Messages differ in length (a payload's size can depend on the data): lengths first, then
        # every message padded to the longest.
        n = torch.tensor([mine.numel()], dtype=torch.int64, device=mine.device)
        sizes = [torch.empty_like(n) for _ in range(self.world)]
        dist.all_gather(sizes, n, group=group)
        self.sizes = [int(s.item()) for s in sizes]
        longest = max(self.sizes)
        padded = torch.zeros(longest, dtype=torch.uint8, device=mine.device)
        padded[:mine.numel()] = mine
        state.padded_bytes += (self.world - 1) * longest
        self.gathered = [torch.empty_like(padded) for _ in range(self.world)]
        self.work = dist.all_gather(self.gathered, padded, group=group, async_op=async_op)

    def mean_into(self, out: torch.Tensor) -> torch.Tensor:
        """Writes the mean of every rank's decoded gradients into the flat `out`, gradient after
        gradient (each g.numel() elements, in order), and returns it."""
        everyone = [unpack_payloads(m[:s].cpu()) for m, s in zip(self.gathered, self.sizes)]
        at = 0
        for i, (g, codec) in enumerate(zip(self.grads, self.codecs)):
            total = None
            for e in range(self.world):  # Note [sums in rank order] in parallel/ranks/group_sum.h
                d = (codec if codec is not None else _IDENTITY).decode(everyone[e][i])
                d = d.reshape(g.shape).to(g.dtype)
                total = d if e == 0 else (total + d if e == 1 else total.add_(d))
            n = g.numel()
            out[at:at + n].copy_(total.reshape(-1).div_(self.world))
            at += n
        return out


def _hook(state: DDPCommState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    grads = bucket.gradients()
    codecs = [c if g.dim() >= 2 else None for g, c in zip(grads, state.codecs_for(bucket))]
    ex = _Exchange(state, grads, codecs, group, async_op=True)
    return ex.work.get_future().then(lambda _: ex.mean_into(bucket.buffer()))


def ddp_comm_hook(spec: str, process_group: Optional[dist.ProcessGroup] = None):
    """(state, hook) for DistributedDataParallel.register_comm_hook:

        model.register_comm_hook(*tapeline.ddp_comm_hook("ef(powersgd(rank=4))"))

    Note [DDP hook = the grid's data-parallel sum]. state.bytes counts the payload bytes this rank
    sent (to world - 1 peers), state.raw_bytes the same gradients uncompressed."""
    return DDPCommState(spec, process_group), _hook
