"""tapeline.Boundary: a compressed cut between two layers of a PyTorch model (compression/boundary.h)."""
from typing import Optional

import torch
from torch import nn

from . import _C


class _Wire(torch.autograd.Function):
    """Forward: the activation through the forward codec (encode, then decode); backward: the
    incoming gradient through the backward codec, per the boundary's backward mode. Both are the
    C++ Boundary's sender and receiver halves, so bytes, state and statistics are the toolkit's."""

    @staticmethod
    def forward(ctx, h, boundary, sample_ids, micro_batch, epoch):
        impl = boundary._impl
        payload = impl.send_forward(h, sample_ids, micro_batch, epoch)
        out = impl.receive_forward(payload, sample_ids, micro_batch, epoch)
        impl.measure_forward(h, out, out)
        ctx.boundary, ctx.sample_ids, ctx.micro_batch, ctx.epoch = boundary, sample_ids, micro_batch, epoch
        return out

    @staticmethod
    def backward(ctx, g):
        impl = ctx.boundary._impl
        if not impl.sends_gradient:  # mode 'none': the stages before the cut get a zero gradient
            return torch.zeros_like(g), None, None, None, None
        payload = impl.send_backward(g.contiguous(), ctx.sample_ids, ctx.micro_batch, ctx.epoch)
        ghat = impl.receive_backward(payload, ctx.sample_ids, ctx.micro_batch, ctx.epoch)
        impl.measure_backward(g, ghat)
        return ghat, None, None, None, None


class Boundary(nn.Module):
    """Drop between two layers of any model: forward compresses the activation with `forward`,
    backward compresses the gradient with `backward` (specs as in docs/COMPRESSION.md; "" or
    "identity": uncompressed).

    mode: "independent" (the backward codec alone), "shared" (the gradient on the forward payload's
    support or basis: topk, randk, projections), "straight-through" (uncompressed gradient), "none"
    (no gradient crosses: zero for the layers before).
    compress_at_inference: in eval() mode, whether the forward still compresses (False: identity,
    nothing counted).
    sample_ids: (B) int64 ids of the batch's samples, for per-sample codecs (aqsgd): pass them to
    forward(x, sample_ids=...) or set boundary.sample_ids before the model runs; boundary.epoch
    the epoch (aqsgd sends full messages for its warm-up epochs, then deltas).

    The codecs' state (error-feedback residuals, AQ-SGD caches, PowerSGD warm starts) is in
    state_dict() under "forward." and "backward."; stats() gives exact bytes sent each way.
    """

    def __init__(self, forward: str = "identity", backward: str = "identity", mode: str = "independent",
                 compress_at_inference: bool = True, measure_error: bool = True, name: str = "boundary"):
        super().__init__()
        for what, spec in (("forward", forward), ("backward", backward)):
            if not isinstance(spec, str):
                raise TypeError(f"Boundary: {what}= must be a spec string, got {type(spec).__name__}")
        self._impl = _C._Boundary(name, forward, backward, mode, compress_at_inference)
        self._impl.measure_error = measure_error
        self.sample_ids: Optional[torch.Tensor] = None
        self.micro_batch = 0
        self.epoch = 0  # per-sample codecs (aqsgd) count their warm-up in epochs: set it as training goes

    # ---- the module -----------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, sample_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        if not self._impl.active():
            return x
        ids = sample_ids if sample_ids is not None else self.sample_ids
        if ids is not None:
            ids = ids.detach().long()
        return _Wire.apply(x, self, ids, self.micro_batch, self.epoch)

    def train(self, mode: bool = True) -> "Boundary":
        super().train(mode)
        self._impl.train(mode)
        return self

    def extra_repr(self) -> str:
        return (f"forward={self._impl.forward_spec!r}, backward={self._impl.backward_spec!r}, "
                f"mode={self._impl.mode!r}, compress_at_inference={self._impl.active_at_inference}")

    # ---- switches and counters ------------------------------------------------------------------
    @property
    def compress_at_inference(self) -> bool:
        return self._impl.active_at_inference

    @compress_at_inference.setter
    def compress_at_inference(self, on: bool) -> None:
        self._impl.active_at_inference = bool(on)

    @property
    def mode(self) -> str:
        return self._impl.mode

    def stats(self) -> dict:
        """{"forward": {...}, "backward": {...}}: messages, bytes (exact payload bytes sent),
        raw_bytes (uncompressed), ratio, last_bytes, rel_error_mean/last, density_mean/last."""
        return self._impl.stats()

    @property
    def forward_bytes(self) -> int:
        return self._impl.stats()["forward"]["bytes"]

    @property
    def backward_bytes(self) -> int:
        return self._impl.stats()["backward"]["bytes"]

    def reset_stats(self) -> None:
        self._impl.reset_stats()

    def after_optimizer_step(self) -> None:
        self._impl.after_optimizer_step()

    # ---- state ----------------------------------------------------------------------------------
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for k, v in sorted(self._impl.state_dict().items()):
            destination[prefix + k] = v if keep_vars else v.detach()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        mine = self._impl.state_dict()
        given = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
        for k in mine:
            if k not in given:
                missing_keys.append(prefix + k)
        for k in given:
            if k not in mine:
                unexpected_keys.append(prefix + k)
        try:
            self._impl.load_state_dict({k: v for k, v in given.items() if k in mine}, False)
        except RuntimeError as e:
            error_msgs.append(f"{prefix or 'boundary'}: {e}")
