"""tapeline.Codec: one C++ codec, for one message stream (compression/compressor.h)."""
from collections import OrderedDict

import torch

from . import _C


class Codec(_C._Codec):
    """A codec built from a spec of tapeline's spec language (docs/COMPRESSION.md), e.g.
    "topk(0.1)", "ef(topk(0.1))", "quant(bits=4) | zstd". A bad spec raises ValueError with the
    parser's message.

    encode(x, sample_ids=None, micro_batch=0, epoch=0) -> Payload: the C++ toolkit's payload
    (Payload.nbytes, bytes(payload), Payload.from_bytes) of x (float32, float16 or bfloat16, any
    shape); decode(payload or its bytes, ...) -> tensor of x's shape and dtype. sample_ids: (B) the
    samples of the micro-batch, for per-sample codecs (aqsgd, whose warm-up is counted in epochs).
    Both are the extension's own methods, called with no Python in between (Note [the binding's
    cost] in python/src/bindings.cpp); a non-tensor x raises TypeError listing what is accepted.

    A stateful codec (ef, ef21, aqsgd, powersgd's warm start) keeps its state here: one Codec per
    message stream, with sender state updated by encode and receiver state by decode (Note [sender
    and receiver state] in compression/compressor.h). In eval() a stateful codec acts as its inner
    codec and leaves its state untouched, as the C++ toolkit's do at inference.
    """

    def __init__(self, spec: str):
        if not isinstance(spec, str):
            raise TypeError(f"Codec: spec must be a str such as 'topk(0.1)', got {type(spec).__name__}")
        super().__init__(spec)
        self.text = spec

    def train(self, mode: bool = True) -> "Codec":
        super().train(mode)
        return self

    def eval(self) -> "Codec":
        return self.train(False)

    def state_dict(self) -> "OrderedDict[str, torch.Tensor]":
        """The codec's state (residuals, caches, warm starts) by name; the tensors share storage
        with the codec."""
        return OrderedDict(sorted(super().state_dict().items()))

    def load_state_dict(self, state, strict: bool = True) -> None:
        super().load_state_dict(dict(state), strict)

    def __repr__(self) -> str:
        return f"Codec({self.spec!r})"
