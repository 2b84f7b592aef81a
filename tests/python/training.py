"""A tiny deterministic training setup shared by the resume tests."""
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
