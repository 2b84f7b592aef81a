"""ckpt.load(into=state) updates `state` in place, like torch.distributed.checkpoint.load:
tensors copied in place, other values replaced, stateful objects loaded through
load_state_dict(), key mismatches per `strict`."""
import collections

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ckpt


def save(root, state, step=1):
    with ckpt.Checkpointer(root) as cp:
        cp.save(step, state)


def test_non_tensor_leaves_are_replaced_in_place(root):
    save(root, {"w": torch.arange(4.0), "step": 7, "lr": 0.25, "name": "run-b", "none": None,
                "flag": None, "hist": [1.5, 2.5, 3.5], "sched": {"last_epoch": 4, "_last_lr": [0.1]},
                "pair": (torch.ones(2), 5), "cfg": (1, "x"), "dtype": torch.bfloat16,
                "od": collections.OrderedDict([("a", 1), ("t", torch.full((2,), 3.0))])})
    w, p0 = torch.zeros(4), torch.zeros(2)
    sched, hist, od = {"last_epoch": 0, "_last_lr": [1.0]}, [0.0], collections.OrderedDict(
        [("a", 0), ("t", torch.zeros(2))])
    into = {"w": w, "step": 0, "lr": 1.0, "name": "run-a", "none": 3, "flag": True, "hist": hist,
            "sched": sched, "pair": (p0, 0), "cfg": (0, "y"), "dtype": torch.float32, "od": od}
    got = ckpt.load(root, into=into)
    assert got is into
    assert into["w"] is w and torch.equal(w, torch.arange(4.0))
    assert into["step"] == 7 and into["lr"] == 0.25 and into["name"] == "run-b"
    assert into["none"] is None and into["flag"] is None and into["dtype"] is torch.bfloat16
    assert into["hist"] == [1.5, 2.5, 3.5]  # a list without tensors is one value: replaced
    assert into["sched"] is sched and sched == {"last_epoch": 4, "_last_lr": [0.1]}
    # A tuple cannot change: it is rebuilt and replaced in its parent; its tensors
    # are still the ones of `into`, filled in place.
    assert into["pair"][0] is p0 and torch.equal(p0, torch.ones(2)) and into["pair"][1] == 5
    assert into["cfg"] == (1, "x")
    assert into["od"] is od and od["a"] == 1 and torch.equal(od["t"], torch.full((2,), 3.0))


def test_resumed_loop_reads_the_saved_step(root):
    save(root, {"model": nn.Linear(2, 2).state_dict(), "step": 300, "epoch": 3})
    state = {"model": nn.Linear(2, 2).state_dict(), "step": 0, "epoch": 0}
    ckpt.load(root, into=state)
    assert state["step"] == 300 and state["epoch"] == 3


def test_missing_keys_raise_and_unexpected_ones_are_ignored_by_default(root):
    save(root, {"w": torch.ones(3), "step": 5, "only_saved": {"x": torch.ones(1), "n": 1}})
    w = torch.zeros(3)
    # `into` asks for something the checkpoint lacks: raises naming it, changes nothing.
    into = {"w": w, "step": 0, "extra": 1, "nested": {"a": torch.zeros(1)}, "empty": {}}
    with pytest.raises(ValueError, match=r"nothing for state\['extra'\], state\['nested'\]"):
        ckpt.load(root, into=into)
    assert into["step"] == 0 and torch.equal(w, torch.zeros(3))
    # strict=False: loads what both have, leaves the rest.
    assert ckpt.load(root, into=into, strict=False) is into
    assert into["step"] == 5 and torch.equal(w, torch.ones(3)) and into["extra"] == 1
    assert "only_saved" not in into  # never added
    # Only the checkpoint has "only_saved": ignored by default, refused by strict=True.
    into = {"w": torch.zeros(3), "step": 0}
    ckpt.load(root, into=into)
    assert into["step"] == 5 and "only_saved" not in into
    into["step"] = 0
    with pytest.raises(ValueError, match=r"no place for state\['only_saved'\]"):
        ckpt.load(root, into=into, strict=True)
    assert into["step"] == 0
    with pytest.raises(ValueError, match="strict"):
        ckpt.load(root, into=into, strict="yes")


def test_a_model_given_for_a_state_saved_around_it_is_named(root):
    # Saved as {"model": ..., "optim": ...}, loaded with into=model: every key
    # of the model is missing, and the message says what the state holds.
    model = torch.nn.Linear(2, 2)
    save(root, {"model": model, "optim": torch.optim.SGD(model.parameters(), lr=0.1)})
    with pytest.raises(ValueError, match=r"nothing for state\['weight'\], state\['bias'\] "
                                         r"\(its state holds state\['model'\], state\['optim'\]\)"):
        ckpt.load(root, into=torch.nn.Linear(2, 2))
    # A place missing beside ones the state has: no such hint.
    with pytest.raises(ValueError) as info:
        ckpt.load(root, into={"model": torch.nn.Linear(2, 2), "sched": {"x": 1}})
    assert "its state holds" not in str(info.value)


def test_sequences_holding_tensors_match_by_index(root):
    save(root, {"ts": [torch.ones(1), torch.full((1,), 2.0), torch.full((1,), 3.0)]})
    a, b = torch.zeros(1), torch.zeros(1)
    into = {"ts": [a, b]}
    ckpt.load(root, into=into)  # index 2 only in the checkpoint: ignored
    assert into["ts"][0] is a and float(a) == 1.0 and float(b) == 2.0 and len(into["ts"]) == 2
    with pytest.raises(ValueError, match=r"state\['ts'\]\[2\]"):
        ckpt.load(root, into={"ts": [a, b]}, strict=True)
    with pytest.raises(ValueError, match=r"nothing for state\['ts'\]\[3\]"):
        ckpt.load(root, into={"ts": [a, b, torch.zeros(1), torch.zeros(1)]})


def test_mismatched_tensors_are_refused_before_anything_is_read(root):
    save(root, {"w": torch.ones(8, 4), "b": torch.ones(2), "step": 3})
    b = torch.zeros(2)
    into = {"b": b, "w": torch.zeros(4, 8), "step": 0}
    with pytest.raises(ValueError, match=r"state\['w'\] has shape \[4, 8\].*\[8, 4\]"):
        ckpt.load(root, into=into)
    assert torch.equal(b, torch.zeros(2)) and into["step"] == 0
    with pytest.raises(TypeError, match=r"state\['w'\] is float64 .* float32"):
        ckpt.load(root, into={"w": torch.zeros(8, 4, dtype=torch.float64)})


def test_top_level_tuple_and_tensor(root):
    save(root + "1", (torch.ones(2), 3))
    t = torch.zeros(2)
    got = ckpt.load(root + "1", into=(t, 0))
    assert type(got) is tuple and got[0] is t and torch.equal(t, torch.ones(2)) and got[1] == 3
    save(root + "2", torch.arange(3))
    t = torch.zeros(3, dtype=torch.int64)
    assert ckpt.load(root + "2", into=t) is t and torch.equal(t, torch.arange(3))


def test_fresh_optimizer_state_dict_in_a_plain_dict_gets_no_state(root):
    """As with DCP: a fresh optimizer's state_dict() has no place for the saved
    moments, so they are not loaded; strict=True says so. Passing the optimizer
    itself (stateful) loads them (test_stateful_objects_round_trip)."""
    model = nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    save(root, {"optim": opt.state_dict()})
    fresh = torch.optim.Adam(nn.Linear(3, 2).parameters())
    into = {"optim": fresh.state_dict()}
    ckpt.load(root, into=into)
    assert into["optim"]["state"] == {}
    with pytest.raises(ValueError, match=r"state\['optim'\]\['state'\]\[0\]"):
        ckpt.load(root, into={"optim": fresh.state_dict()}, strict=True)


# -- stateful objects ------------------------------------------------------------

def make(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Dropout(0.1), nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return model, opt, sched


def train(model, opt, sched, step):
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(4, 8, generator=g), torch.randn(4, 2, generator=g)
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    sched.step()
    return loss.item()


class RngState:
    """A stateful holder of the global RNG, as a training loop would write it."""

    def state_dict(self):
        return {"cpu": torch.get_rng_state()}

    def load_state_dict(self, sd):
        torch.set_rng_state(sd["cpu"])


@pytest.mark.parametrize("before", ["trained", "fresh"])
def test_stateful_objects_round_trip(root, before):
    model, opt, sched = make(0)
    for s in range(1, 6):
        train(model, opt, sched, s)
    with ckpt.Checkpointer(root) as cp:
        cp.save(5, {"model": model, "optim": opt, "sched": sched, "rng": RngState(), "step": 5})
    want = {s: train(model, opt, sched, s) for s in range(6, 10)}
    saved = ckpt.load(root, step=5)  # without `into`: the state_dicts as saved
    assert saved["sched"]["last_epoch"] == 5 and isinstance(saved["model"], collections.OrderedDict)

    model2, opt2, sched2 = make(123)  # different init
    if before == "trained":  # and a different history: everything must be overwritten
        for s in range(100, 103):
            train(model2, opt2, sched2, s)
    state = {"model": model2, "optim": opt2, "sched": sched2, "rng": RngState(), "step": 0}
    params = list(model2.parameters())
    assert ckpt.load(root, into=state, strict=True) is state
    assert state["model"] is model2 and state["optim"] is opt2 and state["sched"] is sched2
    assert state["step"] == 5 and sched2.last_epoch == 5
    assert list(model2.parameters()) == params  # loaded in place
    assert [int(opt2.state[p]["step"]) for p in params] == [5] * len(params)
    assert opt2.param_groups[0]["lr"] == sched2.get_last_lr()[0] == 1e-2 * 0.5 ** 2
    got = {s: train(model2, opt2, sched2, s) for s in range(6, 10)}
    assert got == want  # bit-identical losses (dropout draws from the restored RNG)
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)
    for p, p2 in zip(model.parameters(), model2.parameters()):
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(opt.state[p][k], opt2.state[p2][k])


def test_stateful_module_with_missing_or_extra_keys(root):
    save(root, {"model": nn.Linear(2, 2)})
    bigger = nn.Sequential()
    bigger.add_module("weight", nn.Linear(1, 1))  # not what was saved
    with pytest.raises(ValueError, match=r"state\['model'\]\['weight.weight'\]"):
        ckpt.load(root, into={"model": bigger})
    lin = nn.Linear(2, 2, bias=False)  # the checkpoint also has "bias"
    ckpt.load(root, into={"model": lin})
    with pytest.raises(ValueError, match=r"state\['model'\]\['bias'\]"):
        ckpt.load(root, into={"model": lin}, strict=True)


class Counter:
    """A dataloader-like stateful object holding plain data."""

    def __init__(self):
        self.epoch, self.seen, self.order = 0, 0, []

    def state_dict(self):
        return {"epoch": self.epoch, "seen": self.seen, "order": list(self.order)}

    def load_state_dict(self, sd):
        self.epoch, self.seen, self.order = sd["epoch"], sd["seen"], sd["order"]


def test_custom_stateful_object(root):
    c = Counter()
    c.epoch, c.seen, c.order = 2, 640, [3, 1, 2]
    save(root, {"data": c, "nested": [{"data": c}]})
    assert ckpt.load(root)["data"] == {"epoch": 2, "seen": 640, "order": [3, 1, 2]}
    c2, c3 = Counter(), Counter()
    state = {"data": c2, "nested": [{"data": c3}]}
    ckpt.load(root, into=state)
    assert state["data"] is c2 and (c2.epoch, c2.seen, c2.order) == (2, 640, [3, 1, 2])
    assert (c3.epoch, c3.seen, c3.order) == (2, 640, [3, 1, 2])


def test_classes_are_not_stateful(root):
    cp = ckpt.Checkpointer(root)
    with pytest.raises(TypeError, match="never pickled"):
        cp.save_async(1, {"cls": nn.Linear})  # has state_dict, but as a function
    cp.close()
