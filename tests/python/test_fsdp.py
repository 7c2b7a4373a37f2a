"""tapeline.fsdp_all_reduce_hook under FSDP2 (fully_shard) on 2 Gloo processes (CPU): as the
replicate dimension of a hand-made HSDP it gives the C++ grid's compressed data-parallel sum
(DataParallelSync, through tapeline_py_interop dp-sum) for one step, and with the identity codec
torch's own HSDP; on sharded parameters it compresses each parameter's padded shard."""
import pytest
import torch
from torch import nn

import tapeline
from conftest import cpp_dp_sum, gloo_ranks

try:  # the package's own check of the installed torch (Debian's 1.13: no FSDP2)
    tapeline.fsdp._fsdp_api()
except RuntimeError as e:
    pytest.skip(str(e), allow_module_level=True)

SPECS = ["ef(powersgd(rank=2))", "topk(0.25)"]
LR = 0.1


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 5))  # 5 rows: a padded shard on 2 ranks


def batch(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(16, 12, generator=g), torch.randint(0, 5, (16,), generator=g)


def sharded_step(mesh, x, y, spec=None, group=None):
    """One step of make_model() under fully_shard on `mesh` (each Linear and the root), with the
    tapeline hook over `group` when spec is given: (local gradient shards, local parameters after
    SGD, the hook's state)."""
    from torch.distributed.fsdp import fully_shard
    model = make_model()
    fully_shard(model[0], mesh=mesh)
    fully_shard(model[2], mesh=mesh)
    fully_shard(model, mesh=mesh)
    state = tapeline.fsdp_all_reduce_hook(model, spec, group) if spec else None
    nn.functional.cross_entropy(model(x), y).backward()
    grads = [p.grad.to_local().clone() for p in model.parameters()]
    torch.optim.SGD(model.parameters(), lr=LR).step()
    return grads, [p.detach().to_local().clone() for p in model.parameters()], state


def worker(rank):
    from torch.distributed.device_mesh import init_device_mesh
    x, y = batch(rank)
    local = make_model()  # this rank's own gradients, for the C++ side and the expected values
    nn.functional.cross_entropy(local(x), y).backward()
    result = dict(local=[p.grad.clone() for p in local.parameters()])
    # replicate 2 x shard 1: the hook all-reduces whole gradients over the two ranks
    mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("replicate", "shard"))
    for spec in SPECS + ["identity"]:
        grads, params, state = sharded_step(mesh["shard"], x, y, spec, mesh["replicate"].get_group())
        result[spec] = dict(grads=grads, params=params, bytes=state.bytes, raw_bytes=state.raw_bytes,
                            messages=state.messages, state=dict(state.state_dict()))
    result["hsdp"] = sharded_step(mesh, x, y)[0]  # torch's own HSDP (its dense all-reduce)
    from torch.distributed.fsdp import fully_shard
    try:
        tapeline.fsdp_all_reduce_hook(fully_shard(make_model(), mesh=mesh), "topk(0.25)", mesh["replicate"].get_group())
    except ValueError as e:
        result["hsdp_refused"] = str(e)
    # replicate 1 x shard 2: the hook gets this rank's padded shards (its all-reduce is over one rank)
    mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("replicate", "shard"))
    result["sharded"] = sharded_step(mesh["shard"], x, y, "topk(0.25)", mesh["replicate"].get_group())[0]
    result["sharded_plain"] = sharded_step(mesh["shard"], x, y)[0]
    # a parameter without a gradient: refused with the way out, which then works
    mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("replicate", "shard"))
    for unused_params in (False, True):
        model = HalfUsed()
        fully_shard(model, mesh=mesh["shard"])
        model.set_reduce_scatter_unused_params(unused_params)
        tapeline.fsdp_all_reduce_hook(model, "topk(0.25)", mesh["replicate"].get_group())
        try:
            nn.functional.cross_entropy(model(x), y).backward()
            result[f"unused_{unused_params}"] = model.used.weight.grad.to_local().clone()
        except RuntimeError as e:
            result[f"unused_{unused_params}"] = str(e)
    return result


class HalfUsed(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.used, self.unused = nn.Linear(12, 5), nn.Linear(12, 5)

    def forward(self, x):
        return self.used(x)


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    return gloo_ranks(worker, tmp_path_factory.mktemp("fsdp"))


@pytest.mark.parametrize("spec", SPECS)
def test_hook_equals_the_grids_compressed_sum(spec, fsdp_run, interop, tmp_path):
    cpp = cpp_dp_sum(interop, spec, [fsdp_run[r]["local"] for r in range(2)], tmp_path)
    start = list(make_model().parameters())
    for r in range(2):
        res = fsdp_run[r][spec]
        assert len(res["grads"]) == len(cpp[r]) == 4
        for mine, theirs, p0, p1 in zip(res["grads"], cpp[r], start, res["params"]):
            # the hook averages over the replicas; the grid sums (its loss is over every replica's batch)
            assert torch.allclose(mine, theirs / 2, rtol=1e-6, atol=1e-7)
            assert torch.allclose(p1, p0.detach() - LR * theirs / 2, rtol=1e-6, atol=1e-7)
    for a, b in zip(fsdp_run[0][spec]["grads"], fsdp_run[1][spec]["grads"]):
        assert torch.equal(a, b)  # Note [sums in rank order]
    exact = [(a + b) / 2 for a, b in zip(fsdp_run[0]["local"], fsdp_run[1]["local"])]
    assert any(not torch.allclose(m, e) for m, e in zip(fsdp_run[0][spec]["grads"], exact))
    res = fsdp_run[0][spec]
    assert res["messages"] == 2  # one per parameter group (the two Linears; the root holds none)
    assert 0 < res["bytes"] < res["raw_bytes"] == 4 * sum(p.numel() for p in start)


def test_identity_hook_equals_torchs_hsdp(fsdp_run):
    for r in range(2):
        exact = [(a + b) / 2 for a, b in zip(fsdp_run[0]["local"], fsdp_run[1]["local"])]
        for mine, hsdp, e in zip(fsdp_run[r]["identity"]["grads"], fsdp_run[r]["hsdp"], exact):
            assert torch.allclose(mine, hsdp, rtol=1e-6, atol=1e-7)
            assert torch.allclose(mine, e, rtol=1e-6, atol=1e-7)


def test_sharded_parameters_compressed_shard_by_shard(fsdp_run):
    exact = [(a + b) / 2 for a, b in zip(fsdp_run[0]["local"], fsdp_run[1]["local"])]
    for r in range(2):
        plain = fsdp_run[r]["sharded_plain"]
        for g, p, e in zip(fsdp_run[r]["sharded"], plain, exact):
            rows = -(-e.shape[0] // 2)  # FSDP's padded shard: dim 0 in 2 chunks of ceil(n / 2) rows
            shard = torch.zeros(rows, *e.shape[1:])
            mine = e[r * rows:(r + 1) * rows]
            shard[:mine.shape[0]] = mine
            assert torch.allclose(p, mine, rtol=1e-6, atol=1e-7)  # torch's own FSDP shard
            if e.dim() < 2:
                expected = shard  # 1-dim parameters go uncompressed
            else:
                codec = tapeline.Codec("topk(0.25)")
                expected = codec.decode(codec.encode(shard.reshape(rows, -1))).reshape(shard.shape)
            assert g.shape == mine.shape
            assert torch.allclose(g, expected[:mine.shape[0]], rtol=1e-6, atol=1e-7)
        assert not torch.allclose(fsdp_run[r]["sharded"][2], plain[2])  # TopK dropped something


def test_state_per_parameter(fsdp_run):
    state = fsdp_run[0]["ef(powersgd(rank=2))"]["state"]
    assert any(k.startswith("0.weight.") for k in state) and any(k.startswith("2.weight.") for k in state)
    assert any(k.endswith("error") for k in state)  # the error-feedback residuals
    assert not any(k.startswith(("0.bias", "2.bias")) for k in state)  # uncompressed


def test_parameters_without_gradient(fsdp_run):
    assert "set_reduce_scatter_unused_params(True)" in fsdp_run[0]["unused_False"]
    assert isinstance(fsdp_run[0]["unused_True"], torch.Tensor)
    assert torch.equal(fsdp_run[0]["unused_True"], fsdp_run[1]["unused_True"])


def test_refusals(fsdp_run):
    assert "native HSDP" in fsdp_run[0]["hsdp_refused"]
    with pytest.raises(ValueError, match="cannot compress data-parallel gradients"):
        tapeline.fsdp_all_reduce_hook(nn.Linear(2, 2), "ef21(topk(0.1))", None)
    with pytest.raises(TypeError, match="process_group"):
        tapeline.fsdp_all_reduce_hook(nn.Linear(2, 2), "topk(0.1)", None)
