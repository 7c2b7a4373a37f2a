"""tapeline.fsdp_all_reduce_hook: the replicas' gradient all-reduce of FSDP2 (fully_shard), compressed.

Note [FSDP2's all-reduce hook]. `FSDPModule.set_all_reduce_hook(hook)` (torch >= 2.7,
torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, foreach_reduce) calls hook(reduce_output)
once per parameter group (one fully_shard call) in each backward, after the reduce-scatter, where
reduce_output is this rank's flat shard of the group's reduce-scattered gradients: the parameters
that got a gradient, in the group's order, each its padded shard (fsdp_param.padded_sharded_param_size,
dim 0 split over the shard group), back to back. The hook must leave the result in reduce_output
itself; FSDP then applies its own post-division (over the shard group) and views it as the sharded
gradients. Under native HSDP (fully_shard on a 2-D mesh) the hook runs after FSDP's own dense
all-reduce over the replicas, so there is nothing left to compress: that is refused.

So this hook is the replicate dimension of a hand-made HSDP: fully_shard over the shard mesh
(mesh["shard"]), tapeline over the replicate group (mesh["replicate"].get_group()). It cuts
reduce_output into the parameters' shards, encodes each with its own codec (a shard viewed as the
matrix (rows, the rest); shards of fewer than 2 dims go uncompressed), and reduces them over the
replicate group exactly as the DDP hook reduces a bucket (Note [DDP hook = the grid's data-parallel
sum] in tapeline/ddp.py: all-gather of the payload messages, decode, sum in rank order, divide by the
replicas). With a shard group of one rank, every shard is the whole gradient, and the result is the
C++ grid's compressed data-parallel sum divided by the replicas.
"""
from collections import OrderedDict
from typing import Optional

import torch
import torch.distributed as dist

from .codec import Codec
from .ddp import _CompressedSumState, _Exchange


def _fsdp_api():
    # Debian's torch 1.13 under Python 3.11: importing torch.distributed.fsdp itself fails, with a
    # ValueError from dataclasses (a mutable default in its sharded-tensor metadata); 1.13 has no
    # FSDP2 in any case.
    try:
        from torch.distributed.fsdp import FSDPModule
    except Exception as e:  # noqa: BLE001 (ImportError, or the ValueError above)
        raise RuntimeError(f"fsdp_all_reduce_hook: this torch ({torch.__version__}) has no FSDP2 "
                           f"(torch.distributed.fsdp.FSDPModule, torch >= 2.6): {type(e).__name__}: {e}") from None
    if not hasattr(FSDPModule, "set_all_reduce_hook"):
        raise RuntimeError(f"fsdp_all_reduce_hook: this torch ({torch.__version__}) has no "
                           "FSDPModule.set_all_reduce_hook (torch 2.7 added it)")
    from torch.distributed.fsdp._fully_shard._fsdp_common import DDPMeshInfo
    return FSDPModule, DDPMeshInfo


class FSDPCommState(_CompressedSumState):
    """The hook's state: one codec per parameter (keyed by its name from the root module), and the
    bytes this rank sent to the other replicas (bytes, raw_bytes, padded_bytes, messages: one per
    parameter group and backward)."""

    def __init__(self, spec: str, process_group: dist.ProcessGroup):
        super().__init__(spec, process_group, "fsdp_all_reduce_hook")

    def codec_for(self, name: str) -> Codec:
        return self._codecs.setdefault(name, Codec(self.spec))

    def state_dict(self) -> "OrderedDict[str, torch.Tensor]":
        """Every codec's state, keyed "<parameter name>.<entry>"."""
        return OrderedDict((f"{name}.{k}", v) for name in sorted(self._codecs)
                           for k, v in self._codecs[name].state_dict().items())


def _hook(state: FSDPCommState, param_group, reduce_output: torch.Tensor) -> None:
    params = param_group.fsdp_params
    order = getattr(param_group, "_reduce_scatter_param_indices", range(len(params)))
    shards = [params[i] for i in order]
    total = sum(p.padded_sharded_param_size.numel() for p in shards)
    if reduce_output.numel() != total:
        names = ", ".join(p._param_fqn or "?" for p in shards)
        raise RuntimeError(
            f"fsdp_all_reduce_hook: the reduce-scatter output has {reduce_output.numel()} elements, the shards of "
            f"this group's parameters ({names}) {total}: some of them got no gradient in this backward, and which "
            "ones FSDP does not tell its hook. Call module.set_reduce_scatter_unused_params(True) on this "
            "FSDP module, so that every parameter gets one (zero when unused)")
    grads, codecs, at = [], [], 0
    for p in shards:
        n = p.padded_sharded_param_size.numel()
        if n > 0:  # a rank past the end of a small parameter holds an empty shard
            grads.append(reduce_output[at:at + n].view(p.padded_sharded_param_size))
            codecs.append(state.codec_for(p._param_fqn or str(id(p))) if len(p.padded_sharded_param_size) >= 2
                          else None)
        at += n
    if grads:
        _Exchange(state, grads, codecs, state.process_group, async_op=False).mean_into(reduce_output)


def fsdp_all_reduce_hook(module: torch.nn.Module, spec: str, process_group: dist.ProcessGroup) -> FSDPCommState:
    """Compresses the all-reduce of the gradient shards over `process_group` (the replicas of a
    hand-made HSDP) for every FSDP module in `module` (the ones fully_shard was applied to):

        mesh = init_device_mesh("cuda", (replicas, shards), mesh_dim_names=("replicate", "shard"))
        for layer in model.layers: fully_shard(layer, mesh=mesh["shard"])
        fully_shard(model, mesh=mesh["shard"])
        state = tapeline.fsdp_all_reduce_hook(model, "ef(powersgd(rank=4))", mesh["replicate"].get_group())

    Note [FSDP2's all-reduce hook]. Returns the state: state.bytes, state.raw_bytes,
    state.state_dict(). Codecs the grid refuses for gradients (ef21, aqsgd) are refused, so is a
    module sharded on a 2-D mesh (native HSDP: its replicas' all-reduce is FSDP's own, before the hook)."""
    FSDPModule, DDPMeshInfo = _fsdp_api()
    state = FSDPCommState(spec, process_group)
    if not isinstance(process_group, dist.ProcessGroup):
        raise TypeError(f"fsdp_all_reduce_hook: process_group must be the replicas' torch.distributed.ProcessGroup "
                        f"(e.g. mesh['replicate'].get_group()), got {type(process_group).__name__}")
    sharded = [m for m in module.modules() if isinstance(m, FSDPModule)]
    if not sharded:
        raise ValueError("fsdp_all_reduce_hook: no module in this model is an FSDP module: apply "
                         "torch.distributed.fsdp.fully_shard first")
    for m in sharded:
        groups = m._get_fsdp_state()._fsdp_param_groups
        for g in groups:
            if isinstance(g.mesh_info, DDPMeshInfo):
                raise ValueError(
                    "fsdp_all_reduce_hook: this module is sharded on a 2-D mesh (native HSDP), whose all-reduce over "
                    "the replicas runs uncompressed before the hook: fully_shard it on the shard dimension only "
                    "(mesh['shard']) and pass the replicate dimension's group here (mesh['replicate'].get_group())")
        if len(groups) > 1:  # as set_all_reduce_hook itself
            raise ValueError("fsdp_all_reduce_hook: a module with several parameter groups (shard_placement_fn's "
                             "per-parameter meshes) takes no all-reduce hook in torch")
        if groups:
            m.set_all_reduce_hook(lambda out, group=groups[0]: _hook(state, group, out))
    return state
