"""tapeline.pipelining.CompressedPipelineStage: a torch.distributed.pipelining stage whose messages
are tapeline payloads.

Note [payload messages between stages]. torch's stages exchange dense tensors whose shapes both
ends know, so a receiver posts a buffer of the right size before the data arrives. A payload's size
can depend on the data (threshold, a composition), so each message here is two: its length (one
int64) and its bytes. The length travels as torch's tensor would: the sender returns its send to
the schedule (get_fwd_send_ops / get_bwd_send_ops), the receiver returns its receive
(get_fwd_recv_ops / get_bwd_recv_ops), and the schedule posts and waits for them. The bytes are
sent at once, outside the schedule's batches, when the send ops are made, and received when the
stage takes its input (_retrieve_recv_activations / _retrieve_recv_grads), after the schedule's
wait for the length: by then the sender has posted them. (Returning the bytes' send to the schedule
deadlocks 1F1B: a schedule waits for its sends and its receives together, and a Gloo send completes
only once the peer has posted its receive, which the peer does after its own wait.) Each message's
tag names its cut, direction, kind (length or bytes) and micro-batch, so messages match whatever
order a schedule posts them in. The bytes' sends are waited for at the end of a training step
(perform_reduce_grad, which the schedules call last), at the start of the next step, and by
wait_sends(), which a forward-only step's caller runs before the process may end.

Each cut between stage i and i + 1 is a tapeline Boundary (compression/boundary.h) on both ranks:
stage i runs its sender halves (send_forward, receive_backward) and stage i + 1 its receiver halves
(receive_forward, send_backward), so stateful codecs keep their sender and receiver copies (Note
[sender and receiver state] in compression/compressor.h) and each rank counts the bytes it sends.
One tensor crosses each cut (a stage of several inputs or outputs is refused).
"""
from typing import Optional

import torch
import torch.distributed as dist

try:
    from torch.distributed.pipelining import PipelineStage
except ImportError as e:  # torch before 2.4 (Debian's 1.13): the stage has nothing to subclass
    raise ImportError(f"tapeline.pipelining needs torch.distributed.pipelining (PipelineStage and its schedules, "
                      f"torch >= 2.4), which this torch ({torch.__version__}, {torch.__file__}) does not have: {e}. "
                      "tapeline.Codec, tapeline.Boundary and tapeline.ddp_comm_hook work without it") from None

from . import _C

_FWD, _BWD = 0, 1
_LEN, _BODY = 0, 1


def _tag(lower_stage: int, direction: int, kind: int, chunk: int) -> int:
    if not 0 <= chunk < (1 << 20):
        raise ValueError(f"CompressedPipelineStage: micro-batch {chunk} is out of range (at most 2^20 per step)")
    return 1 + (((lower_stage * 2 + direction) * 2 + kind) << 20) + chunk


class CompressedPipelineStage(PipelineStage):
    """PipelineStage(submodule, stage_index, num_stages, device, ...) whose activations go through
    the codec `forward` and whose gradients go through `backward` (specs as tapeline.Boundary's,
    mode as its backward modes). Works under torch's schedules (GPipe, 1F1B, interleaved, zero
    bubble); the first step may infer shapes as torch's stage does.

    bytes_sent: payload bytes this rank sent (forward to the next stage, backward to the previous);
    wire_bytes_sent: what went on the wire, with the 8-byte length message of each payload;
    stats(): the two boundaries' statistics ("in": the cut before this stage, "out": after).
    train(mode) / eval(): the boundaries' mode (with compress_at_inference=False an eval() stage
    sends dense payloads); set it the same on every stage.
    """

    def __init__(self, submodule, stage_index: int, num_stages: int, device, *args, forward: str = "identity",
                 backward: str = "identity", mode: str = "independent", compress_at_inference: bool = True, **kwargs):
        super().__init__(submodule, stage_index, num_stages, device, *args, **kwargs)
        self.forward_spec, self.backward_spec = forward, backward

        def cut(name):
            b = _C._Boundary(name, forward, backward, mode, compress_at_inference)
            b.measure_error = False  # error needs both ends; each rank holds one
            return b

        self.boundary_in = cut(f"stage{stage_index - 1}->{stage_index}") if stage_index > 0 else None
        self.boundary_out = cut(f"stage{stage_index}->{stage_index + 1}") if stage_index < num_stages - 1 else None
        self.bytes_sent = 0
        self.wire_bytes_sent = 0
        self.messages_sent = 0
        self._pending = {}  # (direction, chunk) -> [(slot, length tensor, peer, group, body tag)]
        self._body_sends = []  # (work, bytes) of the payloads' sends (Note [payload messages between stages])

    # ---- mode and statistics ----------------------------------------------------------------
    def train(self, mode: bool = True) -> "CompressedPipelineStage":
        for b in (self.boundary_in, self.boundary_out):
            if b is not None:
                b.train(mode)
        return self

    def eval(self) -> "CompressedPipelineStage":
        return self.train(False)

    @property
    def compress_at_inference(self) -> bool:
        return any(b.active_at_inference for b in (self.boundary_in, self.boundary_out) if b is not None)

    @compress_at_inference.setter
    def compress_at_inference(self, on: bool) -> None:
        for b in (self.boundary_in, self.boundary_out):
            if b is not None:
                b.active_at_inference = bool(on)

    def stats(self) -> dict:
        return {"in": self.boundary_in.stats() if self.boundary_in is not None else None,
                "out": self.boundary_out.stats() if self.boundary_out is not None else None}

    def reset_stats(self) -> None:
        self.bytes_sent = self.wire_bytes_sent = self.messages_sent = 0
        for b in (self.boundary_in, self.boundary_out):
            if b is not None:
                b.reset_stats()

    def perform_reduce_grad(self, grad_scale_factor: int):
        self.wait_sends()  # the step's last payloads have gone before the step returns
        super().perform_reduce_grad(grad_scale_factor)

    def clear_runtime_states(self) -> None:
        super().clear_runtime_states()
        self.wait_sends()

    # ---- sending -------------------------------------------------------------------------------
    def _send_ops(self, payload, dst_stage: int, direction: int, chunk: int):
        body = payload.to_tensor()
        length = torch.tensor([body.numel()], dtype=torch.int64)
        peer = self._resolve_peer_global_rank(dst_stage)
        group = self._get_p2p_group(self.stage_index, dst_stage)
        lower = min(self.stage_index, dst_stage)
        # Note [payload messages between stages]: the bytes now, the length through the schedule.
        self._body_sends.append((dist.isend(body, peer, group=group, tag=_tag(lower, direction, _BODY, chunk)), body))
        self.bytes_sent += body.numel()
        self.wire_bytes_sent += body.numel() + 8
        self.messages_sent += 1
        return [dist.P2POp(dist.isend, length, peer, group, _tag(lower, direction, _LEN, chunk))]

    def wait_sends(self) -> None:
        """Waits until every payload this stage sent has gone."""
        for work, _ in self._body_sends:
            work.wait()
        self._body_sends.clear()

    @staticmethod
    def _one(what: str, n: int, stage: int):
        if n > 1:
            raise NotImplementedError(f"CompressedPipelineStage: stage {stage} {what} {n} tensors; one tensor crosses "
                                      "each compressed cut (concatenate them, or use one stage per tensor)")

    def get_fwd_send_ops(self, fwd_chunk_id: int):
        state = self._forward_chunk_states[fwd_chunk_id]
        ops = []
        sending = [i for i, dsts in self.act_send_info.items() if any(d is not None for d in dsts)]
        self._one("sends", len(sending), self.stage_index)
        for idx in sending:
            out = state.live_outputs[idx]
            if state.send_pending[idx]:
                raise AssertionError(f"{self.log_prefix} output {idx} of chunk {fwd_chunk_id} already has a pending send")
            state.send_pending[idx] = True
            payload = self.boundary_out.send_forward(out.detach(), None, fwd_chunk_id)
            for dst in [d for d in self.act_send_info[idx] if d is not None]:
                ops += self._send_ops(payload, dst, _FWD, fwd_chunk_id)
        return ops

    def get_bwd_send_ops(self, bwd_chunk_id: int):
        if not self.has_backward or self.is_first:
            return []
        self._check_chunk_id(bwd_chunk_id)
        if self.grad_send_info is None:
            self.grad_send_info = self._create_grad_send_info(self.args_recv_info[0])
        grads_input = self.bwd_cache.pop(bwd_chunk_id)
        if not self.boundary_in.sends_gradient:  # mode none: the previous stage uses a zero gradient
            return []
        ops = []
        slots = [(i, g, dst) for i, (g, dst) in enumerate(zip(grads_input, self.grad_send_info)) if dst is not None]
        self._one("sends gradients of", len(slots), self.stage_index)
        for idx, grad, dst in slots:
            if grad is None:
                meta = self._get_grad_send_meta(idx)
                grad = torch.zeros(meta.shape, dtype=meta.dtype, device=self.device)
            payload = self.boundary_in.send_backward(grad.detach().contiguous(), None, bwd_chunk_id)
            ops += self._send_ops(payload, dst, _BWD, bwd_chunk_id)
        return ops

    # ---- receiving -----------------------------------------------------------------------------
    def _recv_ops(self, infos, direction: int, chunk: int):
        ops, pending = [], []
        for slot, info in enumerate(infos):
            if info.is_root_arg or info.tensor_meta is None:
                continue
            peer = self._resolve_peer_global_rank(info.source)
            group = self._get_p2p_group(info.source, self.stage_index)
            lower = min(self.stage_index, info.source)
            length = torch.empty(1, dtype=torch.int64)
            ops.append(dist.P2POp(dist.irecv, length, peer, group, _tag(lower, direction, _LEN, chunk)))
            pending.append((slot, length, peer, group, _tag(lower, direction, _BODY, chunk)))
        self._one("receives", len(pending), self.stage_index)
        self._pending[(direction, chunk)] = pending
        return ops

    def _receive(self, direction: int, chunk: int):
        """The payloads of (direction, chunk) whose lengths arrived, by slot (Note [payload messages
        between stages])."""
        out = {}
        for slot, length, peer, group, tag in self._pending.pop((direction, chunk), []):
            body = torch.empty(int(length.item()), dtype=torch.uint8)
            dist.recv(body, src=peer, group=group, tag=tag)
            out[slot] = _C.Payload.from_tensor(body)
        return out

    def get_fwd_recv_ops(self, fwd_chunk_id: int):
        return self._recv_ops(self.args_recv_info[fwd_chunk_id], _FWD, fwd_chunk_id)

    def get_bwd_recv_ops(self, bwd_chunk_id: int):
        if not self.has_backward or self.is_last or not self.boundary_out.sends_gradient:
            return []
        return self._recv_ops(self.grad_recv_info[bwd_chunk_id], _BWD, bwd_chunk_id)

    def _clear_unlaunched_fwd_recv(self, microbatch_index: int) -> None:
        self._pending.pop((_FWD, microbatch_index), None)

    def _clear_unlaunched_bwd_recv(self, microbatch_index: int) -> None:
        self._pending.pop((_BWD, microbatch_index), None)

    def _retrieve_recv_activations(self, fwd_chunk_id: int):
        payloads = self._receive(_FWD, fwd_chunk_id)
        activations = []
        for slot, info in enumerate(self.args_recv_info[fwd_chunk_id]):
            if slot not in payloads:
                raise RuntimeError(f"{self.log_prefix} no activation was received for input {slot} of micro-batch "
                                   f"{fwd_chunk_id} (its receive was not posted)")
            x = self.boundary_in.receive_forward(payloads[slot], None, fwd_chunk_id).to(self.device)
            needs_grad = info.tensor_meta.requires_grad and self.has_backward and torch.is_grad_enabled()
            activations.append(x.requires_grad_(needs_grad))
        return tuple(activations)

    def _retrieve_recv_grads(self, bwd_chunk_id: int):
        infos = self.grad_recv_info[bwd_chunk_id]
        if not self.boundary_out.sends_gradient:
            return tuple(None if i.tensor_meta is None else
                         torch.zeros(i.tensor_meta.shape, dtype=i.tensor_meta.dtype, device=self.device) for i in infos)
        payloads = self._receive(_BWD, bwd_chunk_id)
        grads = []
        for slot, info in enumerate(infos):
            if info.tensor_meta is None:
                grads.append(None)
                continue
            grads.append(self.boundary_out.receive_backward(payloads[slot], None, bwd_chunk_id).to(self.device))
        return tuple(grads)
