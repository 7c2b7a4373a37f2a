"""What a torch without a feature tapeline builds on (Debian's 1.13: no torch.distributed.pipelining,
no FSDP2) gets: an error naming the missing feature, not an AttributeError or a bare import failure.
Each test runs only where its feature is absent (elsewhere test_pipelining.py and test_fsdp.py test
the feature itself)."""
import importlib
import importlib.util

import pytest
import torch
from torch import nn

import tapeline


def has_pipelining() -> bool:
    return importlib.util.find_spec("torch.distributed.pipelining") is not None


def has_fsdp2_hook() -> bool:
    try:  # Debian's 1.13 under Python 3.11 fails this import with a ValueError (tapeline/fsdp.py)
        from torch.distributed.fsdp import FSDPModule
    except Exception:  # noqa: BLE001
        return False
    return hasattr(FSDPModule, "set_all_reduce_hook")


@pytest.mark.skipif(has_pipelining(), reason="this torch has torch.distributed.pipelining (test_pipelining.py)")
def test_pipelining_without_torch_pipelining_names_it():
    with pytest.raises(ImportError, match=r"tapeline.pipelining needs torch.distributed.pipelining .*torch >= 2.4.*"
                                          + torch.__version__.replace(".", r"\.")):
        importlib.import_module("tapeline.pipelining")


@pytest.mark.skipif(has_fsdp2_hook(), reason="this torch has FSDPModule.set_all_reduce_hook (test_fsdp.py)")
def test_fsdp_hook_without_fsdp2_names_it():
    with pytest.raises(RuntimeError, match=r"fsdp_all_reduce_hook: this torch \(" + torch.__version__.replace(".", r"\.")
                                           + r"\) has no (FSDP2|FSDPModule.set_all_reduce_hook)"):
        tapeline.fsdp_all_reduce_hook(nn.Linear(4, 4), "topk(0.25)", None)
