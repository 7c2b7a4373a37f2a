"""tapeline's codecs for PyTorch programs (docs/PYTHON.md).

    import tapeline
    codec = tapeline.Codec("ef(topk(0.1))")
    payload = codec.encode(x)          # the C++ toolkit's wire bytes: payload.nbytes, bytes(payload)
    y = codec.decode(payload)

    model = nn.Sequential(a, tapeline.Boundary(forward="topk(0.1)", backward="quant(bits=8)"), b)
    ddp.register_comm_hook(*tapeline.ddp_comm_hook("ef(powersgd(rank=4))"))
    state = tapeline.fsdp_all_reduce_hook(model, "ef(topk(0.1))", mesh["replicate"].get_group())
"""
from ._build_info import TORCH_VERSION as _BUILT_FOR

import torch as _torch

if _torch.__version__ != _BUILT_FOR:
    raise ImportError(
        f"tapeline was built against torch {_BUILT_FOR}, but this Python imports torch {_torch.__version__} "
        f"from {_torch.__file__}: a C++ extension only works with the torch it was compiled against (its "
        f"C++ ABI and libtorch symbols). Rebuild tapeline for this torch (pip install ./python, or "
        f"scripts/build against it), or use the Python tapeline was built for.")

from ._C import Payload, codecs  # noqa: E402
from .codec import Codec  # noqa: E402
from .boundary import Boundary  # noqa: E402
from .ddp import ddp_comm_hook, DDPCommState  # noqa: E402
from .fsdp import fsdp_all_reduce_hook, FSDPCommState  # noqa: E402

__all__ = ["Codec", "Payload", "Boundary", "ddp_comm_hook", "DDPCommState", "fsdp_all_reduce_hook",
           "FSDPCommState", "codecs"]
