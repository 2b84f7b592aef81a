"""`ckpt-restore --out FILE.safetensors` read back by torch.

The file is read two ways: parsed here from the format's specification
(8-byte little-endian header length, JSON header, raw little-endian data)
into torch tensors with torch.frombuffer — an implementation independent of
the C++ exporter and of ckpt's own reader — and by the `safetensors` package's
own loader (installed from PyPI by the test command; skipped where absent).
"""
import json
import struct
import subprocess

import pytest
import torch

import ckpt
from training import make_model, state_of, train_step

DTYPES = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
    "I32": torch.int32, "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16,
    "F32": torch.float32, "F64": torch.float64, "U16": torch.uint16, "U32": torch.uint32,
    "U64": torch.uint64, "C64": torch.complex64, "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2, "F8_E4M3FNUZ": torch.float8_e4m3fnuz,
    "F8_E5M2FNUZ": torch.float8_e5m2fnuz, "F8_E8M0": torch.float8_e8m0fnu,
}


def read_safetensors(path):
    """Returns (tensors by name, metadata) from the format's specification."""
    with open(path, "rb") as f:
        blob = f.read()
    (header_len,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + header_len].decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    data = memoryview(blob)[8 + header_len:]
    tensors = {}
    end = 0
    for name, info in header.items():
        begin, stop = info["data_offsets"]
        assert begin <= stop <= len(data), f"{name}: offsets {begin}..{stop} outside the data"
        end = max(end, stop)
        dtype = DTYPES[info["dtype"]]
        raw = bytes(data[begin:stop])
        if stop == begin:
            t = torch.empty(info["shape"], dtype=dtype)
        else:
            t = torch.frombuffer(bytearray(raw), dtype=dtype).reshape(info["shape"])
        tensors[name] = t
    assert end == len(data), "data past the last tensor"
    return tensors, metadata


def export(ckpt_restore, root, out, *args):
    subprocess.run([ckpt_restore, "--root", root, "--out", str(out), *args],
                   check=True, capture_output=True, text=True)


def bits(t):
    """The raw bytes, so NaN payloads and -0.0 compare exactly."""
    return t.reshape(-1).view(torch.uint8) if t.dtype != torch.bool and t.numel() else t


def test_exported_model_loads_into_a_fresh_torch_model(root, tmp_path, ckpt_restore):
    model, optimizer = make_model(seed=0)
    with ckpt.Checkpointer(root, delta="exact", full_every=4) as cp:
        for step in range(1, 7):
            train_step(model, optimizer, step)
            cp.save(step, state_of(model, optimizer, step))
    # Step 6 is a delta: the export resolves the chain.
    out = tmp_path / "model.safetensors"
    export(ckpt_restore, root, out, "--step", "6", "--filter", "model.")
    tensors, metadata = read_safetensors(out)
    assert metadata["ckpt_step"] == "6"
    assert set(tensors) == {f"model.{k}" for k in model.state_dict()}

    fresh, _ = make_model(seed=99)
    fresh.load_state_dict({k[len("model."):]: v for k, v in tensors.items()}, strict=True)
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k


def test_safetensors_load_file_into_a_real_model_strictly(root, tmp_path, ckpt_restore):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    model, optimizer = make_model(seed=1)
    with ckpt.Checkpointer(root, delta="exact", full_every=3) as cp:
        for step in range(1, 5):
            train_step(model, optimizer, step)
            cp.save(step, state_of(model, optimizer, step))
    out = tmp_path / "model.safetensors"
    export(ckpt_restore, root, out, "--latest", "--filter", "model.")
    loaded = safetensors_torch.load_file(str(out))
    fresh, _ = make_model(seed=42)
    fresh.load_state_dict({k[len("model."):]: v for k, v in loaded.items()}, strict=True)
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k


def test_python_export_matches_the_cli_and_is_typed(root, tmp_path, ckpt_restore, monkeypatch):
    monkeypatch.setenv("CKPT_RESTORE", ckpt_restore)
    model, optimizer = make_model(seed=3)
    with ckpt.Checkpointer(root, delta="exact") as cp:
        for step in range(1, 4):
            train_step(model, optimizer, step)
            cp.save(step, state_of(model, optimizer, step))
    out = ckpt.export(root, tmp_path / "m.safetensors", filter="model.")
    tensors, metadata = read_safetensors(out)
    assert metadata["ckpt_step"] == "3"
    assert {k[len("model."):] for k in tensors} == set(model.state_dict())
    cli = tmp_path / "cli.safetensors"
    export(ckpt_restore, root, cli, "--step", "2")
    assert ckpt.export(root, tmp_path / "s2.safetensors", step=2) and \
        (tmp_path / "s2.safetensors").read_bytes() == cli.read_bytes()
    with pytest.raises(FileExistsError):
        ckpt.export(root, out)
    with pytest.raises(ckpt.CheckpointNotFoundError):
        ckpt.export(root, tmp_path / "none.safetensors", step=99)


def every_dtype_state():
    g = torch.Generator().manual_seed(7)
    return {
        "f32": torch.randn(3, 5, generator=g),
        "f64": torch.randn(7, generator=g, dtype=torch.float64),
        "f16": torch.randn(4, 4, generator=g).half(),
        "bf16": torch.randn(2, 3, 4, generator=g).bfloat16(),
        "i64": torch.randint(-2**40, 2**40, (9,), generator=g),
        "i32": torch.randint(-2**30, 2**30, (3, 3), generator=g, dtype=torch.int32),
        "i16": torch.randint(-2**15, 2**15, (5,), generator=g, dtype=torch.int16),
        "i8": torch.randint(-128, 128, (6,), generator=g, dtype=torch.int8),
        "u8": torch.randint(0, 256, (11,), generator=g, dtype=torch.uint8),
        "mask": torch.rand(13, generator=g) > 0.5,
        "scalar": torch.tensor(3.25),
        "empty": torch.empty(0, 4),
        "special": torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0]),
        "u16": torch.randint(0, 2**16, (4,), generator=g).to(torch.uint16),
        "u64": torch.randint(0, 2**62, (4,), generator=g).to(torch.uint64),
        "freqs_cis": torch.polar(torch.ones(8, 4), torch.randn(8, 4, generator=g)),  # complex64
        "f8_e4m3": torch.randn(16, generator=g).to(torch.float8_e4m3fn),
        "f8_e5m2": torch.randn(16, generator=g).to(torch.float8_e5m2),
        "f8_e4m3fnuz": torch.randn(16, generator=g).to(torch.float8_e4m3fnuz),
        "f8_e5m2fnuz": torch.randn(16, generator=g).to(torch.float8_e5m2fnuz),
    }


def export_every_dtype(root, tmp_path, ckpt_restore):
    state = every_dtype_state()
    with ckpt.Checkpointer(root) as cp:
        cp.save(1, {"t": state, "note": "hello"})
    out = tmp_path / "all.safetensors"
    export(ckpt_restore, root, out, "--step", "1")
    return state, out


def test_every_dtype_and_shape_round_trips(root, tmp_path, ckpt_restore):
    state, out = export_every_dtype(root, tmp_path, ckpt_restore)
    tensors, metadata = read_safetensors(out)
    assert set(tensors) == {f"t.{k}" for k in state}
    for k, v in state.items():
        got = tensors[f"t.{k}"]
        assert got.dtype == v.dtype and got.shape == v.shape, k
        assert torch.equal(bits(got), bits(v)), k
    # The extras (the state's non-tensor leaves) ride along in the metadata.
    assert "hello" in metadata["ckpt_extras"]


def test_safetensors_own_loader_reads_the_export(root, tmp_path, ckpt_restore):
    safetensors_torch = pytest.importorskip(
        "safetensors.torch", reason="the safetensors package is not installed (not in Debian 12)")
    state, out = export_every_dtype(root, tmp_path, ckpt_restore)
    loaded = safetensors_torch.load_file(str(out))
    for k, v in state.items():
        assert torch.equal(bits(loaded[f"t.{k}"]), bits(v)), k


def test_dtypes_safetensors_cannot_name(root, tmp_path, ckpt_restore):
    # float8_e8m0fnu is in the format's specification (F8_E8M0; the
    # safetensors package's torch loader does not map it yet): exported, read
    # back from the specification. complex128 has no name: refused, naming
    # the tensor and its dtype, and no file is left.
    scales = torch.exp2(torch.arange(-4, 4).float()).to(torch.float8_e8m0fnu)
    with ckpt.Checkpointer(root) as cp:
        cp.save(1, {"scales": scales})
        cp.save(2, {"scales": scales, "z": torch.randn(3, dtype=torch.complex128)})
    out = tmp_path / "scales.safetensors"
    export(ckpt_restore, root, out, "--step", "1")
    tensors, _ = read_safetensors(out)
    assert torch.equal(bits(tensors["scales"]), bits(scales))
    refused = tmp_path / "z.safetensors"
    r = subprocess.run([ckpt_restore, "--root", root, "--out", str(refused), "--step", "2"],
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert '"z" is complex128' in r.stderr and "safetensors cannot name" in r.stderr, r.stderr
    assert not refused.exists()


def test_export_refuses_to_overwrite(root, tmp_path, ckpt_restore):
    with ckpt.Checkpointer(root) as cp:
        cp.save(1, {"w": torch.ones(3)})
    out = tmp_path / "existing.safetensors"
    out.write_bytes(b"precious")
    proc = subprocess.run([ckpt_restore, "--root", root, "--out", str(out), "--step", "1"],
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert "exists" in proc.stderr
    assert out.read_bytes() == b"precious"
