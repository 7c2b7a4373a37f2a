"""tapeline.pipelining.CompressedPipelineStage under torch.distributed.pipelining's schedules on 2
Gloo processes: with the identity codec it computes what torch's own PipelineStage computes; with
TopK the bytes it sends are the payloads' bytes."""

import pytest
import torch
from torch import nn

import tapeline
from conftest import gloo_ranks

pytest.importorskip("torch.distributed.pipelining", reason="this torch has no torch.distributed.pipelining")

MICRO = 4


def halves():
    torch.manual_seed(0)
    return (nn.Sequential(nn.Linear(12, 32), nn.ReLU()),
            nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)))


def data():
    g = torch.Generator().manual_seed(7)
    return torch.randn(8 * MICRO, 12, generator=g), torch.randint(0, 4, (8 * MICRO,), generator=g)


def run(rank, schedule_cls, make_stage):
    from torch.distributed.pipelining import PipelineStage  # noqa: F401 (imported in the worker)
    mod = halves()[rank]
    stage = make_stage(mod, rank)
    schedule = schedule_cls(stage, n_microbatches=MICRO, loss_fn=nn.functional.cross_entropy)
    x, y = data()
    losses = []
    if rank == 0:
        schedule.step(x)
    else:
        schedule.step(target=y, losses=losses)
    return stage, [p.grad.clone() for p in mod.parameters()], [l.detach() for l in losses], mod


def quarters():
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(12, 16), nn.ReLU()), nn.Sequential(nn.Linear(16, 16), nn.ReLU()),
            nn.Sequential(nn.Linear(16, 16), nn.ReLU()), nn.Linear(16, 4)]


def run_interleaved(rank, schedule_cls, make_stage):
    """4 stages on 2 ranks (rank r holds stages r and r + 2): the multi-stage schedules."""
    parts = quarters()
    held = [rank, rank + 2]
    schedule = schedule_cls([make_stage(parts[i], i) for i in held], n_microbatches=MICRO,
                            loss_fn=nn.functional.cross_entropy)
    x, y = data()
    losses = []
    if rank == 0:
        schedule.step(x, target=y, losses=losses)
    else:
        schedule.step(target=y, losses=losses)
    return [p.grad.clone() for i in held for p in parts[i].parameters()], [l.detach() for l in losses]


def worker(rank):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from tapeline.pipelining import CompressedPipelineStage
    cpu = torch.device("cpu")
    result = {}
    for name, cls in (("gpipe", ScheduleGPipe), ("1f1b", Schedule1F1B)):
        _, g_torch, l_torch, _ = run(rank, cls, lambda m, r: PipelineStage(m, r, 2, cpu))
        st, g_id, l_id, _ = run(rank, cls, lambda m, r: CompressedPipelineStage(m, r, 2, cpu))
        result[name] = dict(torch=(g_torch, l_torch), identity=(g_id, l_id), identity_bytes=st.bytes_sent)
    from torch.distributed.pipelining import ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble
    for name, cls in (("interleaved", ScheduleInterleaved1F1B), ("zero_bubble", ScheduleInterleavedZeroBubble)):
        result[name] = dict(torch=run_interleaved(rank, cls, lambda m, i: PipelineStage(m, i, 4, cpu)),
                            identity=run_interleaved(rank, cls, lambda m, i: CompressedPipelineStage(m, i, 4, cpu)))
    stage, grads, losses, mod = run(rank, Schedule1F1B, lambda m, r: CompressedPipelineStage(
        m, r, 2, cpu, forward="topk(0.1)", backward="quant(bits=8)"))
    sent = None
    if rank == 0:  # what stage 0 sent, encoded again here: one topk payload per micro-batch
        x, _ = data()
        codec = tapeline.Codec("topk(0.1)")
        with torch.no_grad():
            sent = sum(codec.encode(mod(xm)).nbytes for xm in x.chunk(MICRO))
    result["topk"] = dict(grads=grads, losses=losses, bytes=stage.bytes_sent, wire=stage.wire_bytes_sent,
                          messages=stage.messages_sent, stats=stage.stats(), expected=sent)
    return result


@pytest.fixture(scope="module")
def pipe_run(tmp_path_factory):
    return gloo_ranks(worker, tmp_path_factory.mktemp("pipe"))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_identity_equals_torchs_stage(schedule, pipe_run):
    for r in range(2):
        res = pipe_run[r][schedule]
        g_torch, l_torch = res["torch"]
        g_id, l_id = res["identity"]
        assert len(g_torch) == len(g_id) > 0
        for a, b in zip(g_torch, g_id):
            assert torch.equal(a, b)
        assert len(l_torch) == len(l_id) == (MICRO if r == 1 else 0)
        for a, b in zip(l_torch, l_id):
            assert torch.equal(a, b)
    # identity payloads: the activations' bytes and a header each
    assert pipe_run[0][schedule]["identity_bytes"] == MICRO * tapeline._C.identity_payload_bytes(torch.empty(8, 32))


@pytest.mark.parametrize("schedule", ["interleaved", "zero_bubble"])
def test_identity_equals_torchs_stage_multi_stage_schedules(schedule, pipe_run):
    for r in range(2):
        (g_torch, l_torch), (g_id, l_id) = pipe_run[r][schedule]["torch"], pipe_run[r][schedule]["identity"]
        assert len(g_torch) == len(g_id) == 4
        for a, b in zip(g_torch, g_id):
            assert torch.equal(a, b)
        assert len(l_torch) == len(l_id) == (MICRO if r == 1 else 0)
        for a, b in zip(l_torch, l_id):
            assert torch.equal(a, b)


def test_topk_bytes_sent_are_the_payload_bytes(pipe_run):
    r0, r1 = pipe_run[0]["topk"], pipe_run[1]["topk"]
    assert r0["bytes"] == r0["expected"] == r0["stats"]["out"]["forward"]["bytes"]
    assert r0["messages"] == MICRO and r0["wire"] == r0["bytes"] + 8 * MICRO
    assert r0["bytes"] < MICRO * 8 * 32 * 4 / 3  # TopK 0.1 in fp16 with indices
    assert r1["bytes"] == r1["stats"]["in"]["backward"]["bytes"] and r1["messages"] == MICRO
    assert r1["stats"]["in"]["forward"]["messages"] == 0  # the receiver counts what it sends only
    assert len(r1["losses"]) == MICRO and all(torch.isfinite(l) for l in r1["losses"])
    torch_grads = pipe_run[0]["1f1b"]["torch"][0]
    assert any(not torch.equal(a, b) for a, b in zip(torch_grads, r0["grads"]))  # compressed: not torch's
