"""Tensors of every dtype, layout and size round trip, in new tensors and in place."""
import pytest
import torch

import ckpt
from training import assert_same_tree

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.uint16, torch.uint32, torch.uint64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64,
          torch.complex64, torch.complex128,
          torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
          torch.float8_e8m0fnu]
# Beyond what torch.save users meet most: dtypes real states hold (a RoPE
# freqs_cis buffer is complex64; FP8 training keeps float8 weights and scales).
WIDER_DTYPES = [torch.complex64, torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2,
                torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu]


def sample(dtype, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype) * 100
    if dtype == torch.float8_e8m0fnu:  # powers of two only
        return torch.exp2(torch.randint(-20, 20, shape, generator=g).float()).to(dtype)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 100).to(dtype)
    if dtype in (torch.uint32, torch.uint64):  # no iinfo; randint stops at int64
        return torch.randint(0, 2 ** 62, shape, generator=g, dtype=torch.int64).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64).to(dtype)


def roundtrip(root, state, **kw):
    with ckpt.Checkpointer(root, **kw) as cp:
        cp.save(1, state)
    return ckpt.load(root)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtypes(root, dtype):
    state = {"x": sample(dtype, (37, 5)), "scalar": sample(dtype, ()), "empty": sample(dtype, (0, 3))}
    got = roundtrip(root, state)
    assert_same_tree(state, got)


def test_special_float_values_keep_their_bits(root):
    x = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-45, 3.4e38])
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        got = roundtrip(f"{root}-{dtype}", {"x": x.to(dtype)})
        assert_same_tree({"x": x.to(dtype)}, got)


def test_non_contiguous_tensors(root):
    base = sample(torch.float32, (6, 8, 10))
    state = {"t": base.transpose(0, 2), "stepped": base[::2, 1::3, :], "expanded": torch.ones(3, 1).expand(3, 5),
             "permuted_bf16": base.to(torch.bfloat16).permute(2, 0, 1), "diag": base[0].diagonal()}
    expected = {k: v.clone() for k, v in state.items()}
    got = roundtrip(root, state)
    assert_same_tree(expected, got)
    for v in got.values():
        assert v.is_contiguous()


def test_zero_size_tensors(root):
    state = {"a": torch.empty(0), "b": torch.empty(4, 0, 2, dtype=torch.int64), "c": torch.empty(0, dtype=torch.bool),
             "d": torch.zeros(2, 2)}
    got = roundtrip(root, state, delta="exact")
    assert_same_tree(state, got)


def test_views_sharing_storage(root):
    """A tensor that is the same view of the same storage as an earlier one
    (tied weights) is stored once and loads as that one tensor; other views
    of one storage (a slice, a reshape) are each saved as their own tensor
    and no longer share storage on load (documented in docs/python.md)."""
    base = torch.arange(24, dtype=torch.float32)
    state = {"base": base, "head": base[:6], "grid": base.view(4, 6), "col": base.view(4, 6)[:, 2],
             "same": base, "tied": [base, base]}
    got = roundtrip(root, state)
    assert_same_tree({k: (v.clone() if isinstance(v, torch.Tensor) else [t.clone() for t in v])
                      for k, v in state.items()}, got)
    assert got["same"] is got["base"] and got["tied"][0] is got["base"] and got["tied"][1] is got["base"]
    assert sorted(t["name"] for t in ckpt.describe(root)["tensors"]) == ["base", "col", "grid", "head"]
    got["base"][0] = 100.0
    assert got["head"][0] == 0.0 and got["grid"][0, 0] == 0.0


def test_tied_tensors_load_into_tied_untied_and_replaced_places(root):
    w = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    with ckpt.Checkpointer(root, delta="exact") as cp:
        cp.save(1, {"a": {"w": w}, "b": [w], "c": 5})
        w.add_(1)
        cp.save(2, {"a": {"w": w}, "b": [w], "c": 6})
    tied = torch.zeros(3, 2)
    into = {"a": {"w": tied}, "b": [tied], "c": 0}
    ckpt.load(root, into=into)
    assert into["a"]["w"] is tied and into["b"][0] is tied and torch.equal(tied, w)
    untied = {"a": {"w": torch.zeros(3, 2)}, "b": [torch.zeros(3, 2)], "c": 0}
    ckpt.load(root, into=untied)
    assert torch.equal(untied["a"]["w"], w) and torch.equal(untied["b"][0], w)
    assert untied["a"]["w"].data_ptr() != untied["b"][0].data_ptr()
    replaced = {"a": None, "b": None, "c": 0}  # places whose saved value replaces them
    ckpt.load(root, into=replaced)
    assert replaced["a"]["w"] is replaced["b"][0] and torch.equal(replaced["b"][0], w)


def test_load_into_existing_tensors(root):
    state = {"w": sample(torch.float32, (8, 4)), "h": sample(torch.float16, (3,)),
             "n": sample(torch.int64, (2, 2)), "only_saved": sample(torch.bfloat16, (5,)), "k": 3}
    with ckpt.Checkpointer(root) as cp:
        cp.save(1, state)
    w = torch.zeros(8, 4)
    h_storage = torch.zeros(6, dtype=torch.float16)
    h = h_storage[::2]  # a strided destination
    n = torch.zeros(2, 2, dtype=torch.int64).t()
    into = {"w": w, "h": h, "n": n, "k": 0}
    got = ckpt.load(root, into=into)
    assert got is into and got["w"] is w and got["h"] is h and got["n"] is n
    assert torch.equal(w, state["w"]) and torch.equal(h, state["h"]) and torch.equal(n, state["n"])
    assert torch.equal(h_storage[1::2], torch.zeros(3, dtype=torch.float16))
    # `into` is updated in place (non-tensor leaves too); saved tensors it has no
    # place for are ignored, as torch.distributed.checkpoint.load does.
    assert got["k"] == 3 and "only_saved" not in got
    with pytest.raises(ValueError, match="shape"):
        ckpt.load(root, into={"w": torch.zeros(4, 8)})
    with pytest.raises(TypeError, match="float32"):
        ckpt.load(root, into={"w": torch.zeros(8, 4, dtype=torch.float64)})


def test_requires_grad_parameters_are_saved_and_loaded_into(root):
    lin = torch.nn.Linear(3, 2)
    with ckpt.Checkpointer(root) as cp:
        cp.save(1, {"w": lin.weight, "params": list(lin.parameters())})
    fresh = torch.nn.Linear(3, 2)
    ckpt.load(root, into={"w": fresh.weight})
    assert torch.equal(fresh.weight, lin.weight) and fresh.weight.requires_grad


def changed(t, seed):
    """`t` with about a third of its elements replaced (a training step)."""
    def elements(x):  # one row of bytes per element
        return x.reshape(-1).view(torch.uint8).reshape(x.numel(), x.element_size())
    fresh = sample(t.dtype, tuple(t.shape), seed)
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(t.numel(), 1, generator=g) < 0.33
    out = torch.where(mask, elements(fresh), elements(t))
    return out.reshape(-1).view(t.dtype).reshape(t.shape)


@pytest.mark.parametrize("dtype", WIDER_DTYPES, ids=str)
@pytest.mark.parametrize("mode", [dict(), dict(delta="exact"), dict(delta="topk", topk_ratio=0.05),
                                  dict(delta="exact", compression="floats"), dict(compression=3),
                                  dict(delta="exact", lazy=True)],
                         ids=["full", "exact", "topk", "exact-floats", "zstd", "exact-lazy"])
def test_complex_and_float8_states_in_every_mode(root, dtype, mode):
    # A chain: a full save, then saves of a third of the elements changed;
    # each step restores bit-exactly (top-k is exact for these dtypes), new
    # and in place, from the newest and from an older step.
    big = sample(dtype, (300, 257), seed=1)  # several staging chunks' worth
    states = [{"freqs": big, "small": sample(dtype, (7,), seed=2), "w": sample(torch.float32, (64,), seed=3)}]
    for s in range(1, 4):
        prev = states[-1]
        states.append({"freqs": changed(prev["freqs"], 10 + s), "small": prev["small"],
                       "w": prev["w"] + 1})
    with ckpt.Checkpointer(root, full_every=10, **mode) as cp:
        for step, state in enumerate(states):
            cp.save_async(step, state).result()
    if mode.get("delta"):  # stored as exact deltas, never as top-k
        encodings = [{t["name"]: t["encoding"] for t in ckpt.describe(root, step=s)["tensors"]}["freqs"]
                     for s in range(1, len(states))]
        assert set(encodings) <= {"sparse", "xor", "xor_planes"}, encodings
    for step in (len(states) - 1, 1):
        got = ckpt.load(root, step=step)
        assert_same_tree({k: states[step][k] for k in ("freqs", "small")},
                         {k: got[k] for k in ("freqs", "small")})
        into = {"freqs": torch.zeros_like(big), "small": torch.zeros(7, dtype=dtype), "w": torch.zeros(64)}
        ckpt.load(root, step=step, into=into)
        assert_same_tree({k: states[step][k] for k in ("freqs", "small")},
                         {k: into[k] for k in ("freqs", "small")})
    for step in range(len(states)):
        ckpt.verify(root, step)


def test_unsupported_tensors_are_refused(root):
    cp = ckpt.Checkpointer(root)
    with pytest.raises(TypeError, match="complex32"):
        cp.save_async(1, {"c": torch.ones(2, dtype=torch.complex32)})
    with pytest.raises(TypeError, match="sparse|strided"):
        cp.save_async(1, {"s": torch.eye(3).to_sparse()})
    cp.close()
    assert ckpt.list_steps(root) == []
