"""tapeline.Codec and tapeline.Payload: the C++ toolkit's codecs and bytes from Python."""
import struct
import subprocess

import pytest
import torch

import tapeline
from tapeline.ddp import pack_payloads, unpack_payloads

# Stateless and stateful codecs, sparse, quantised, low-rank and composed.
SPECS = ["identity", "topk(0.1)", "topk(0.05, scope=global, index=bitmap)", "quant(bits=4)", "quant(bits=3, scale=block, block=64)",
         "fp16", "bf16", "randk(0.1, seed=3)", "ef(topk(0.05))", "powersgd(rank=2)", "ef(powersgd(rank=2))",
         "hadquant(bits=4, tile=32)", "quantile(bits=4)", "ef21(quant(bits=4))", "topk(0.2) | quant(bits=8)",
         "colsparse(k=0.25, block=8)", "threshold(0.5)"]


def tensors(n=3, shape=(16, 48), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) for _ in range(n)]


def identity_file(path, xs):
    ident = tapeline.Codec("identity")
    path.write_bytes(pack_payloads([ident.encode(x) for x in xs]).numpy().tobytes())


def read_file(path):
    return unpack_payloads(torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8))


def test_roundtrip_shape_dtype_and_bytes():
    x = torch.randn(8, 32)
    c = tapeline.Codec("topk(0.25)")
    p = c.encode(x)
    assert p.codec == "topk" and p.shape == [8, 32] and p.dtype == "Float"
    raw = bytes(p)
    assert len(raw) == p.nbytes == len(p)
    assert raw[:1] == b"T" and struct.unpack_from("<H", raw, 2)[0] == p.codec_id
    y = c.decode(p)
    assert y.shape == x.shape and y.dtype == x.dtype
    kept = y != 0
    assert kept.sum().item() == 8 * 8  # k = 0.25 of each row's 32
    assert torch.equal(y[kept], x[kept].half().float())  # values as fp16 by default
    q = tapeline.Payload.from_bytes(raw)
    assert bytes(q) == raw and torch.equal(c.decode(q), y) and torch.equal(c.decode(raw), y)
    assert torch.equal(c.decode(bytearray(raw)), y) and torch.equal(c.decode(memoryview(raw)), y)
    assert torch.equal(c.decode(raw, None, 0, 0), y)  # positional sample_ids, micro_batch, epoch
    assert torch.equal(tapeline.Payload.from_tensor(p.to_tensor()).to_tensor(), p.to_tensor())


def test_half_precision_inputs_keep_dtype():
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.randn(4, 64).to(dtype)
        y = tapeline.Codec("quant(bits=8)").decode(tapeline.Codec("quant(bits=8)").encode(x))
        assert y.dtype == dtype and y.shape == x.shape


def test_bad_spec_is_value_error_with_parser_message():
    with pytest.raises(ValueError, match=r"bad compressor spec: unexpected end of the spec at column 6"):
        tapeline.Codec("topk(")
    with pytest.raises(ValueError, match=r"unknown compressor 'nosuch' in 'nosuch\(1\)'; known: .*topk"):
        tapeline.Codec("nosuch(1)")
    with pytest.raises(ValueError, match=r"topk: unknown argument 'bogus'"):
        tapeline.Codec("topk(0.1, bogus=2)")
    with pytest.raises(TypeError):
        tapeline.Codec(3)
    # torch's pybind11 caster names the tensor type: torch.Tensor, at::Tensor in 1.13 (Debian's)
    with pytest.raises(TypeError, match=r"(?s)incompatible function arguments.*x: (torch\.Tensor|at::Tensor)"):
        tapeline.Codec("topk(0.1)").encode([1.0, 2.0])
    with pytest.raises(TypeError, match=r"(?s)incompatible function arguments.*payload: tapeline._C.Payload"):
        tapeline.Codec("topk(0.1)").decode("not a payload")


def test_corrupt_payload_is_runtime_error():
    raw = bytearray(bytes(tapeline.Codec("quant(bits=4)").encode(torch.randn(100))))
    with pytest.raises(RuntimeError):
        tapeline.Payload.from_bytes(bytes(raw[: len(raw) // 2]))
    raw[0] = ord("X")
    with pytest.raises(RuntimeError):
        tapeline.Payload.from_bytes(bytes(raw))
    with pytest.raises(RuntimeError):  # a payload of another codec
        tapeline.Codec("topk(0.1)").decode(tapeline.Codec("quant(bits=4)").encode(torch.randn(100)))


def test_state_dict_round_trip_continues_the_stream():
    xs = tensors(4)
    a = tapeline.Codec("ef(topk(0.05))")
    for x in xs[:2]:
        a.encode(x)
    state = a.state_dict()
    assert list(state) and all(isinstance(v, torch.Tensor) for v in state.values())
    assert any(v.abs().sum() > 0 for v in state.values())  # the residual
    b = tapeline.Codec("ef(topk(0.05))")
    b.load_state_dict({k: v.clone() for k, v in state.items()})
    assert bytes(a.encode(xs[2])) == bytes(b.encode(xs[2]))
    fresh = tapeline.Codec("ef(topk(0.05))")
    assert bytes(fresh.encode(xs[3])) != bytes(a.encode(xs[3]))
    with pytest.raises(RuntimeError, match="unexpected"):
        fresh.load_state_dict({"nope": torch.zeros(1)})


def test_eval_leaves_error_feedback_state_alone():
    c = tapeline.Codec("ef(topk(0.1))")
    c.encode(torch.randn(8, 8))
    before = {k: v.clone() for k, v in c.state_dict().items()}
    c.eval()
    assert not c.training
    c.encode(torch.randn(8, 8))
    for k, v in c.state_dict().items():
        assert torch.equal(v, before[k])


@pytest.fixture(scope="module")
def cpp_side(interop, tmp_path_factory):
    """For every spec: the C++ library's payloads of tensors(), and its decoding of Python's
    payloads of them (one run of tapeline_py_interop for all)."""
    d = tmp_path_factory.mktemp("interop")
    xs = tensors()
    identity_file(d / "x.bin", xs)
    jobs, py = [], {}
    for i, spec in enumerate(SPECS):
        enc = tapeline.Codec(spec)
        py[spec] = [enc.encode(x) for x in xs]
        (d / f"py{i}.bin").write_bytes(pack_payloads(py[spec]).numpy().tobytes())
        jobs.append(f"encode\t{spec}\t{d / 'x.bin'}\t{d / f'cpp{i}.bin'}")
        jobs.append(f"decode\t{spec}\t{d / f'py{i}.bin'}\t{d / f'dec{i}.bin'}")
    (d / "jobs").write_text("\n".join(jobs) + "\n")
    subprocess.run([interop, "batch", str(d / "jobs")], check=True)
    ident = tapeline.Codec("identity")
    return {spec: (py[spec], read_file(d / f"cpp{i}.bin"), [ident.decode(p) for p in read_file(d / f"dec{i}.bin")])
            for i, spec in enumerate(SPECS)}


@pytest.mark.parametrize("spec", SPECS)
def test_python_bytes_are_the_cpp_librarys(spec, cpp_side):
    """Python encodes; the C++ library (tapeline_py_interop) encodes the same tensors with the same
    codec: the payload bytes are equal. Each side decodes the other's payloads: equal tensors."""
    py, cpp, cpp_decoded = cpp_side[spec]
    assert [bytes(p) for p in py] == [bytes(p) for p in cpp]
    dec = tapeline.Codec(spec)
    py_decoded = [dec.decode(p) for p in cpp]
    assert len(cpp_decoded) == len(py_decoded) == 3
    for a, b in zip(cpp_decoded, py_decoded):
        assert torch.equal(a, b)


def test_interop_reports_bad_input(interop, tmp_path):
    (tmp_path / "bad.bin").write_bytes(b"\x05\x00")
    r = subprocess.run([interop, "decode", "topk(0.1)", str(tmp_path / "bad.bin"), str(tmp_path / "o.bin")],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "truncated" in r.stderr
