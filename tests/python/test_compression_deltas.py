"""Byte-plane compression of full saves, differential and chained deltas, and
deltas that continue across Checkpointer instances (issue 16): every option
crossed with every delta mode, on real training steps, restored bit-exactly."""
import pytest
import torch

import ckpt
from training import assert_same_tree, assert_topk_restored, make_model, state_of, train_step


def train_and_save(root, steps, start=1, model=None, **kw):
    model, optimizer = model if model is not None else make_model(0)
    saved, stats = {}, {}
    with ckpt.Checkpointer(root, **kw) as cp:
        for step in range(start, start + steps):
            train_step(model, optimizer, step)
            state = state_of(model, optimizer, step)
            stats[step] = cp.save(step, state)
            saved[step] = {"model": type(state["model"])((k, v.clone()) for k, v in state["model"].items()),
                           "step": step}
    return (model, optimizer), saved, stats


def check_restores(root, saved):
    for step, want in saved.items():
        got = ckpt.load(root, step=step)
        assert got["step"] == step
        assert_same_tree(want["model"], got["model"], f"step {step} model")


TOPK_RATIO = 0.01  # the Checkpointer's default

DELTA_MODES = [("none", "differential"),  # (no deltas: the base does not apply)
               ("exact", "differential"), ("exact", "chained"),
               ("topk", "differential"), ("topk", "chained")]


@pytest.mark.parametrize("delta,base", DELTA_MODES, ids=[f"{d}-{b}" for d, b in DELTA_MODES])
@pytest.mark.parametrize("compression", [None, 3, "zstd", "floats"])
def test_every_compression_with_every_delta_mode(root, delta, compression, base):
    _, saved, stats = train_and_save(root, 5, delta=delta, full_every=3, compression=compression,
                                     delta_base=base)
    kinds = "".join(stats[s]["kind"][0] for s in sorted(stats))
    # full_every=3 bounds the interval (the restore bound may take fulls earlier).
    assert kinds[0] == "f" and "ddd" not in kinds, kinds
    if delta != "topk":
        check_restores(root, saved)
        return
    # Lossy: each delta step against its base as restored (the last full
    # save, or chained the step before), with an error computed from the
    # values (training.assert_topk_restored).
    base_state = None
    for step in sorted(saved):
        got = ckpt.load(root, step=step)
        assert got["step"] == step
        if stats[step]["kind"] == "full":
            assert_same_tree(saved[step]["model"], got["model"], f"step {step} model")
        else:
            for name, want in saved[step]["model"].items():
                assert_topk_restored(want, got["model"][name], base_state[name], TOPK_RATIO,
                                     f"step {step} {name}")
        if stats[step]["kind"] == "full" or base == "chained":
            base_state = got["model"]


def adamw_state(dtype):
    """An MLP's weights and AdamW moments after real steps, as `dtype`."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(32, 256)).pow(2).mean().backward()
        optimizer.step()
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    cast = lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() else t  # noqa: E731
    return {"model": {k: cast(v) for k, v in state["model"].items()},
            "optim": {"state": {k: {n: cast(v) for n, v in s.items()}
                                for k, s in state["optim"]["state"].items()},
                      "param_groups": state["optim"]["param_groups"]}}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_floats_shrink_float_state_and_restore_bit_exactly(root, dtype):
    state = adamw_state(dtype)
    with ckpt.Checkpointer(root, compression="floats", adaptive_compression=False) as cp:
        stats = cp.save(1, state)
    # Byte planes of weights and moments (fp32 ~0.8, bf16 ~0.65; the manifest is included).
    assert stats["file_bytes"] < (0.9 if dtype == torch.float32 else 0.8) * stats["tensor_bytes"], stats
    assert_same_tree(state, ckpt.load(root))


def test_adaptive_floats_restore_bit_exactly(root):
    _, saved, _ = train_and_save(root, 3, compression="floats")  # the rule chooses per block
    check_restores(root, saved)


@pytest.mark.parametrize("base", ["differential", "chained"])
def test_deltas_continue_in_a_new_checkpointer(root, base):
    # (No bound on the restore: this small model's deltas are nearly its size.)
    opts = dict(delta="exact", full_every=10, delta_base=base, max_restore_read_factor=0)
    model, saved, _ = train_and_save(root, 2, **opts)
    _, more, stats = train_and_save(root, 2, start=3, model=model, **opts)
    assert stats[3]["kind"] == "delta"
    saved.update(more)
    check_restores(root, saved)
    _, _, off = train_and_save(root, 1, start=5, model=model, delta="exact", resume_deltas=False)
    assert off[5]["kind"] == "full"


def test_bad_compression_names_what_is_wrong(root):
    with pytest.raises(ValueError, match="compression"):
        ckpt.Checkpointer(root, compression="lz4")
    with pytest.raises(ValueError, match="delta_base"):
        ckpt.Checkpointer(root, delta="exact", delta_base="sideways")
