"""tapeline.ddp_comm_hook under DistributedDataParallel on 2 Gloo processes, against the C++ grid's
compressed data-parallel sum (DataParallelSync, through tapeline_py_interop dp-sum) for one step."""
import pytest
import torch
from torch import nn

import tapeline
from conftest import cpp_dp_sum, gloo_ranks

SPECS = ["ef(powersgd(rank=2))", "topk(0.25)"]


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 6))


def batch(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(16, 12, generator=g), torch.randint(0, 6, (16,), generator=g)


def ddp_worker(rank):
    x, y = batch(rank)
    result = {}
    for spec in SPECS:
        local = make_model()  # this rank's own gradients, for the C++ side
        nn.functional.cross_entropy(local(x), y).backward()
        model = nn.parallel.DistributedDataParallel(make_model())
        state, hook = tapeline.ddp_comm_hook(spec)
        model.register_comm_hook(state, hook)
        nn.functional.cross_entropy(model(x), y).backward()
        result[spec] = dict(local=[p.grad.clone() for p in local.parameters()],
                            reduced=[p.grad.clone() for p in model.parameters()],
                            bytes=state.bytes, raw_bytes=state.raw_bytes, state=dict(state.state_dict()))
    return result


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    return gloo_ranks(ddp_worker, tmp_path_factory.mktemp("ddp"))


@pytest.mark.parametrize("spec", SPECS)
def test_hook_equals_the_grids_compressed_sum(spec, ddp_run, interop, tmp_path):
    cpp = cpp_dp_sum(interop, spec, [ddp_run[r][spec]["local"] for r in range(2)], tmp_path)
    for r in range(2):
        reduced = ddp_run[r][spec]["reduced"]
        assert len(reduced) == len(cpp[r])
        for mine, theirs in zip(reduced, cpp[r]):
            # DDP averages the ranks' gradients; the grid sums them (its loss is over every replica's batch)
            assert torch.allclose(mine, theirs / 2, rtol=1e-6, atol=1e-7)
    # both ranks hold the same sum (Note [sums in rank order])
    for a, b in zip(ddp_run[0][spec]["reduced"], ddp_run[1][spec]["reduced"]):
        assert torch.equal(a, b)
    # compressed: differs from the exact mean, and fewer bytes than the raw gradients
    exact = [(a + b) / 2 for a, b in zip(ddp_run[0][spec]["local"], ddp_run[1][spec]["local"])]
    assert any(not torch.allclose(m, e) for m, e in zip(ddp_run[0][spec]["reduced"], exact))
    assert 0 < ddp_run[0][spec]["bytes"] < ddp_run[0][spec]["raw_bytes"]


def test_hook_state_per_bucket(ddp_run):
    state = ddp_run[0]["ef(powersgd(rank=2))"]["state"]
    assert state and all(k.startswith("bucket") for k in state)
    assert any(k.endswith("error") for k in state)  # the error-feedback residuals


def test_refuses_codecs_the_grid_refuses():
    with pytest.raises(ValueError, match="cannot compress data-parallel gradients"):
        tapeline.ddp_comm_hook("ef21(topk(0.1))")
    with pytest.raises(ValueError, match="bad compressor spec"):
        tapeline.ddp_comm_hook("topk(")
