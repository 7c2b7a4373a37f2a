"""tapeline.Boundary: a compressed cut inside an ordinary PyTorch model."""
import subprocess
import sys

import pytest
import torch
from torch import nn

import tapeline


def model_with(boundary, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), boundary, nn.Linear(32, 3))


def test_forward_and_backward_are_the_codecs_messages():
    b = tapeline.Boundary(forward="topk(0.25)", backward="quant(bits=4)")
    h = torch.randn(5, 32, requires_grad=True)
    out = b(h)
    fwd = tapeline.Codec("topk(0.25)")
    p = fwd.encode(h.detach())
    assert torch.equal(out, fwd.decode(p))
    g = torch.randn(5, 32)
    out.backward(g)
    bwd = tapeline.Codec("quant(bits=4)")
    q = bwd.encode(g)
    assert torch.equal(h.grad, bwd.decode(q))
    s = b.stats()
    assert s["forward"]["messages"] == 1 and s["forward"]["bytes"] == p.nbytes == b.forward_bytes
    assert s["backward"]["messages"] == 1 and s["backward"]["bytes"] == q.nbytes == b.backward_bytes
    assert s["forward"]["raw_bytes"] == s["backward"]["raw_bytes"] == 5 * 32 * 4
    assert 0 < s["forward"]["rel_error_last"] < 1 and s["forward"]["density_last"] == pytest.approx(0.25)
    b.reset_stats()
    assert b.stats()["forward"]["messages"] == 0


def test_trains_inside_a_model():
    torch.manual_seed(1)
    x = torch.randn(64, 12)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    b = tapeline.Boundary(forward="ef(topk(0.25))", backward="quant(bits=8)")
    m = model_with(b)
    first = None
    for _ in range(40):
        loss = nn.functional.cross_entropy(m(x), y)
        first = first if first is not None else loss.item()
        m.zero_grad()
        loss.backward()
        with torch.no_grad():  # plain SGD (torch.optim's first step imports much of torch._dynamo)
            for p in m.parameters():
                p -= 0.2 * p.grad
    assert loss.item() < 0.7 * first
    assert b.stats()["forward"]["messages"] == 40 and b.stats()["backward"]["messages"] == 40


def test_compress_at_inference_toggle():
    b = tapeline.Boundary(forward="quant(bits=2)", compress_at_inference=False)
    m = model_with(b).eval()
    x = torch.randn(7, 12)
    reference = model_with(nn.Identity()).eval()
    with torch.no_grad():
        assert torch.equal(m(x), reference(x))  # off: the identity, nothing counted
        assert b.stats()["forward"]["messages"] == 0
        b.compress_at_inference = True
        compressed = m(x)
        assert not torch.equal(compressed, reference(x))
        assert b.stats()["forward"]["messages"] == 1
    m.train()
    assert b.compress_at_inference and b.training
    m(x)
    assert b.stats()["forward"]["messages"] == 2  # training always compresses


def test_backward_modes():
    h = torch.randn(4, 40, requires_grad=True)
    shared = tapeline.Boundary(forward="topk(0.1)", mode="shared")
    out = shared(h)
    out.backward(torch.randn(4, 40))
    assert torch.equal(h.grad != 0, out != 0)  # the gradient on the forward payload's support
    h.grad = None
    none = tapeline.Boundary(forward="quant(bits=8)", mode="none")
    none(h).sum().backward()
    assert torch.count_nonzero(h.grad) == 0
    h.grad = None
    ste = tapeline.Boundary(forward="topk(0.1)", mode="straight-through")
    g = torch.randn(4, 40)
    ste(h).backward(g)
    assert torch.equal(h.grad, g)
    with pytest.raises(ValueError, match="unknown backward mode 'sideways'"):
        tapeline.Boundary(mode="sideways")
    with pytest.raises(ValueError, match="bad compressor spec"):
        tapeline.Boundary(forward="topk(")
    with pytest.raises(ValueError, match="not available from Python"):
        tapeline.Boundary(forward="ae(8)")


def test_aqsgd_per_sample_state():
    b = tapeline.Boundary(forward="aqsgd(quant(bits=2), warmup=1)")
    h = torch.randn(6, 16)
    ids = torch.tensor([5, 1, 9, 2, 7, 3])
    with pytest.raises(RuntimeError, match="needs the sample ids"):
        b(h)
    first = b(h, sample_ids=ids)  # warm-up epoch: full precision, cached per sample
    assert torch.equal(first, h)
    b.epoch = 1
    b.sample_ids = ids
    h2 = h + 0.01 * torch.randn(6, 16)
    second = b(h2)  # deltas against the cache: close to h2, not h2
    assert not torch.equal(second, h2)
    assert (second - h2).norm() < 0.1 * (h2 - h).norm() * 6
    assert b.stats()["forward"]["last_bytes"] < b.stats()["forward"]["last_raw_bytes"] / 3
    state = b.state_dict()
    assert {"forward.cache_sender_rows", "forward.cache_receiver_rows"} <= set(state)


def test_state_dict_in_the_models_state_dict():
    b = tapeline.Boundary(forward="ef(topk(0.1))", backward="ef(quant(bits=2))")
    m = model_with(b)
    x = torch.randn(8, 12)
    m(x).sum().backward()
    state = m.state_dict()
    assert "2.forward.error" in state and "2.backward.error" in state
    b2 = tapeline.Boundary(forward="ef(topk(0.1))", backward="ef(quant(bits=2))")
    m2 = model_with(b2, seed=5)
    m2.load_state_dict(state)
    assert torch.equal(m(x), m2(x))  # same weights and same pending residual: same message
    bad = dict(state)
    bad["2.forward.bogus"] = torch.zeros(1)
    with pytest.raises(RuntimeError, match="2.forward.bogus"):
        m2.load_state_dict(bad)
    missing = {k: v for k, v in state.items() if k != "2.backward.error"}
    result = m2.load_state_dict(missing, strict=False)
    assert result.missing_keys == ["2.backward.error"]


def test_refuses_another_torch(tmp_path):
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("__version__ = '0.0.1'\n")
    code = "import sys; sys.path.insert(0, sys.argv[1]); import tapeline"
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
    assert r.returncode != 0
    assert "tapeline was built against torch " + torch.__version__ + ", but this Python imports torch 0.0.1" in r.stderr
