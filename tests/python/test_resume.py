"""Resume fidelity: restore at step k and continue == the uninterrupted run, bit for bit."""
import pytest
import torch

import ckpt
from training import assert_same_tree, make_model, state_of, train_step

N = 12
EVERY = 3


def uninterrupted(root, delta):
    """Trains N steps, checkpointing every EVERY steps; returns losses and the final state."""
    model, optimizer = make_model(seed=0)
    losses = {}
    with ckpt.Checkpointer(root, delta=delta, full_every=3) as cp:
        for step in range(1, N + 1):
            losses[step] = train_step(model, optimizer, step)
            if step % EVERY == 0:
                cp.save_async(step, state_of(model, optimizer, step))
    return losses, state_of(model, optimizer, N)


def resume(root, k, into):
    """A fresh process-like start: different init, restore step k, train to N.

    into=True loads in place into the live objects (stateful: the model and the
    optimizer are loaded through their state_dict()/load_state_dict(), and the
    fresh optimizer, which has no state yet, gets the saved one). A plain
    optimizer.state_dict() of a fresh optimizer would not do: like
    torch.distributed.checkpoint.load, load(into=) ignores saved entries that
    `into` has no place for (see test_load_into.py)."""
    model, optimizer = make_model(seed=123)
    if into:
        state = {"model": model, "optim": optimizer, "step": 0, "rng": torch.get_rng_state()}
        got = ckpt.load(root, step=k, into=state)
        assert got is state and state["model"] is model and state["optim"] is optimizer
    else:
        state = ckpt.load(root, step=k)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
    assert state["step"] == k
    torch.set_rng_state(state["rng"])
    losses = {}
    for step in range(k + 1, N + 1):
        losses[step] = train_step(model, optimizer, step)
    return losses, state_of(model, optimizer, N)


@pytest.mark.parametrize("delta", ["none", "exact"])
@pytest.mark.parametrize("k", [6, 9])
@pytest.mark.parametrize("into", [False, True], ids=["new", "into"])
def test_resume_is_bit_identical(root, delta, k, into):
    losses, final = uninterrupted(root, delta)
    assert ckpt.list_steps(root) == [3, 6, 9, 12]
    resumed_losses, resumed = resume(root, k, into)
    for step, loss in resumed_losses.items():
        assert loss == losses[step], f"step {step}: {loss!r} vs {losses[step]!r}"
    resumed["rng"] = final["rng"] = None  # compared implicitly through the dropout losses
    assert_same_tree(final, resumed)


def test_restored_state_equals_saved_state(root):
    model, optimizer = make_model(seed=0)
    for step in range(1, 4):
        train_step(model, optimizer, step)
    saved = state_of(model, optimizer, 3)
    expected = {"model": {k: v.clone() for k, v in saved["model"].items()},
                "optim": {"state": {i: {k: v.clone() for k, v in s.items()}
                                    for i, s in saved["optim"]["state"].items()},
                          "param_groups": saved["optim"]["param_groups"]},
                "step": 3, "rng": saved["rng"].clone()}
    with ckpt.Checkpointer(root, delta="exact") as cp:
        cp.save(3, saved)
    got = ckpt.load(root)
    assert type(got["model"]) is type(saved["model"])  # OrderedDict, with _metadata
    assert got["model"]._metadata == saved["model"]._metadata
    assert sorted(got["optim"]["state"]) == [0, 1, 2, 3, 4, 5]  # int keys stay int
    got["model"] = dict(got["model"])
    assert_same_tree(expected, got)


def test_exact_delta_chain_restores_every_step(root):
    """Every step of an exact-delta run (full_every=4) restores to what was saved."""
    model, optimizer = make_model(seed=0)
    saved = {}
    with ckpt.Checkpointer(root, delta="exact", full_every=4) as cp:
        for step in range(1, 11):
            train_step(model, optimizer, step)
            saved[step] = {k: v.clone() for k, v in model.state_dict().items()}
            cp.save_async(step, {"model": model.state_dict()})
    for step, expected in saved.items():
        got = ckpt.load(root, step=step)["model"]
        for name, t in expected.items():
            assert torch.equal(got[name], t), f"step {step}: {name}"


def test_lazy_loop_from_the_docs(root):
    """The docs/python.md loop: lazy save at the top of a step, forward and
    backward overlap the copy, wait for staging before optimizer.step()."""
    import torch.nn.functional as F
    from training import batch

    def run(model, optimizer, first, total, cp):
        losses = {}
        for step in range(first, total):
            resp = None
            if cp is not None and step % 3 == 0 and step > first:
                resp = cp.save_async(step, state_of(model, optimizer, step))
            x, y = batch(step)
            loss = F.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            if resp is not None:
                resp.staging_completion.result()
            optimizer.step()
            losses[step] = loss.item()
        return losses

    model, optimizer = make_model(seed=0)
    with ckpt.Checkpointer(root, delta="exact", lazy=True, full_every=2) as cp:
        losses = run(model, optimizer, 0, N, cp)
    final = state_of(model, optimizer, N)
    assert ckpt.list_steps(root) == [3, 6, 9]
    model2, optimizer2 = make_model(seed=5)
    state = ckpt.load(root, step=6)
    model2.load_state_dict(state["model"])
    optimizer2.load_state_dict(state["optim"])
    torch.set_rng_state(state["rng"])
    resumed = run(model2, optimizer2, 6, N, None)
    assert all(resumed[s] == losses[s] for s in resumed)
    final2 = state_of(model2, optimizer2, N)
    final["rng"] = final2["rng"] = None
    assert_same_tree(final, final2)
