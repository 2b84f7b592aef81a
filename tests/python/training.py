"""A tiny deterministic training setup shared by the resume tests."""
import math

import torch
import torch.nn.functional as F
from torch import nn


def make_model(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.1), nn.LayerNorm(32),
                          nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, optimizer


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def train_step(model, optimizer, step):
    x, y = batch(step)
    optimizer.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def state_of(model, optimizer, step):
    return {"model": model.state_dict(), "optim": optimizer.state_dict(), "step": step,
            "rng": torch.get_rng_state()}


def assert_same_tree(a, b, path="state"):
    """Equal structure, key types, leaf types and bit-identical tensors."""
    assert type(a) is type(b), f"{path}: {type(a)} vs {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
        assert torch.equal(_bits(a), _bits(b)), f"{path}: tensors differ"
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), f"{path}: keys {list(a.keys())} vs {list(b.keys())}"
        for (ka, va), kb in zip(a.items(), b.keys()):
            assert type(ka) is type(kb), f"{path}: key {ka!r} type {type(ka)} vs {type(kb)}"
            assert_same_tree(va, b[kb], f"{path}[{ka!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: length {len(a)} vs {len(b)}"
        for i, (va, vb) in enumerate(zip(a, b)):
            assert_same_tree(va, vb, f"{path}[{i}]")
    elif isinstance(a, float) and a != a:
        assert b != b, f"{path}: nan vs {b!r}"
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"
        if isinstance(a, float):
            assert repr(a) == repr(b), f"{path}: {a!r} vs {b!r}"


def _bits(t):
    """The raw bytes of a tensor (so -0.0 != 0.0 and NaN payloads compare)."""
    t = t.detach().contiguous().cpu()
    if t.numel() == 0:
        return torch.empty(0, dtype=torch.uint8)
    return t.reshape(-1).view(torch.uint8) if t.dtype != torch.bool else t.reshape(-1).to(torch.uint8)


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _elements(t):
    """Each element's bits as one integer (NaN payloads and -0.0 compare)."""
    t = t.detach().contiguous().cpu().reshape(-1)
    return t.view(_INT_OF_SIZE[t.element_size()])


def assert_topk_restored(want, got, base, ratio, what="tensor"):
    """Checks `got`, restored from a top-k delta of `want` taken against
    `base` (what a restore of the delta's base yields), from the values
    alone -- not from the bound the engine recorded -- and returns its error,
    max |got - want|:
    * every element is `want`'s or `base`'s, bit for bit (a delta stores new
      values, never sums);
    * at least k = ceil(ratio * numel) changed elements (all, if fewer
      changed) are restored exactly;
    * no dropped change is larger than a kept one, and none is non-finite
      (non-finite changes are always kept). With the count above this bounds
      the error by the (k+1)-th largest |want - base|.
    Integer and bool tensors are never lossy: restored exactly."""
    if not want.is_floating_point():
        assert torch.equal(_bits(want), _bits(got)), f"{what}: a {want.dtype} tensor must restore exactly"
        return 0.0
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{list(got.shape)}"
    w, g, b = _elements(want), _elements(got), _elements(base)
    is_want = g == w
    assert bool((is_want | (g == b)).all()), f"{what}: values that are neither the saved nor the base's"
    changed = w != b
    kept, dropped = changed & is_want, changed & ~is_want
    k = math.ceil(ratio * w.numel())
    n_kept, n_changed = int(kept.sum()), int(changed.sum())
    assert n_kept >= min(k, n_changed), f"{what}: {n_kept} changes kept, top-k keeps {k} of {n_changed}"
    if n_kept == n_changed:
        return 0.0  # nothing dropped: restored exactly
    flat_want, flat_base = want.detach().reshape(-1), base.detach().reshape(-1)

    def changes(mask):
        return (flat_want[mask].double() - flat_base[mask].double()).abs()

    lost = changes(dropped)  # = |got - want| where got kept the base's value
    assert bool(torch.isfinite(lost).all()), f"{what}: a non-finite change was dropped"
    largest_dropped = float(lost.max())
    if n_kept:
        held = changes(kept)
        held = held[torch.isfinite(held)]
        if held.numel():
            smallest_kept = float(held.min())
            assert largest_dropped <= smallest_kept, \
                f"{what}: dropped a change of {largest_dropped} but kept one of {smallest_kept}"
    return largest_dropped
