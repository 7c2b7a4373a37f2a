"""tapeline.Codec: one C++ codec, for one message stream (compression/compressor.h)."""
from collections import OrderedDict
from typing import Optional

import torch

from . import _C


class Codec:
    """A codec built from a spec of tapeline's spec language (docs/COMPRESSION.md), e.g.
    "topk(0.1)", "ef(topk(0.1))", "quant(bits=4) | zstd". A bad spec raises ValueError with the
    parser's message.

    encode(x) -> Payload: the C++ toolkit's payload (Payload.nbytes, bytes(payload),
    Payload.from_bytes); decode(payload) -> tensor of x's shape and dtype. A stateful codec (ef,
    ef21, aqsgd, powersgd's warm start) keeps its state here: one Codec per message stream, with
    sender state updated by encode and receiver state by decode (Note [sender and receiver state]
    in compression/compressor.h). In eval() a stateful codec acts as its inner codec and leaves its
    state untouched, as the C++ toolkit's do at inference.
    """

    def __init__(self, spec: str):
        if not isinstance(spec, str):
            raise TypeError(f"Codec: spec must be a str such as 'topk(0.1)', got {type(spec).__name__}")
        self._impl = _C._Codec(spec)
        self.text = spec

    @property
    def spec(self) -> str:
        """The canonical spec: Codec(c.spec) builds an equivalent codec."""
        return self._impl.spec

    @property
    def decode_has_state(self) -> bool:
        return self._impl.decode_has_state

    @property
    def training(self) -> bool:
        return self._impl.training

    def train(self, mode: bool = True) -> "Codec":
        self._impl.train(mode)
        return self

    def eval(self) -> "Codec":
        return self.train(False)

    def encode(self, x: torch.Tensor, sample_ids: Optional[torch.Tensor] = None, micro_batch: int = 0,
               epoch: int = 0) -> _C.Payload:
        """Packs x (float32, float16 or bfloat16, any shape). sample_ids: (B) the samples of the
        micro-batch, for per-sample codecs (aqsgd, whose warm-up is counted in epochs)."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"Codec.encode: expected a torch.Tensor, got {type(x).__name__}")
        return self._impl.encode(x, sample_ids, micro_batch, epoch=epoch)

    def decode(self, payload, sample_ids: Optional[torch.Tensor] = None, micro_batch: int = 0,
               epoch: int = 0) -> torch.Tensor:
        """Unpacks a Payload (or its bytes) to a tensor of the original shape and dtype."""
        if isinstance(payload, (bytes, bytearray, memoryview)):
            payload = _C.Payload.from_bytes(bytes(payload))
        return self._impl.decode(payload, sample_ids, micro_batch, epoch=epoch)

    def state_dict(self) -> "OrderedDict[str, torch.Tensor]":
        """The codec's state (residuals, caches, warm starts) by name; the tensors share storage
        with the codec."""
        return OrderedDict(sorted(self._impl.state_dict().items()))

    def load_state_dict(self, state, strict: bool = True) -> None:
        self._impl.load_state_dict(dict(state), strict)

    def __repr__(self) -> str:
        return f"Codec({self.spec!r})"
