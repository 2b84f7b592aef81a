"""Non-tensor leaves and containers round trip exactly; other objects are refused."""
import collections
import enum
import fractions
import math

import pytest
import torch

import ckpt
from training import assert_same_tree


def roundtrip(root, state):
    with ckpt.Checkpointer(root) as cp:
        cp.save(1, state)
    return ckpt.load(root)


def test_leaves_and_containers(root):
    od = collections.OrderedDict([("z", 1), ("a", 2)])
    od._metadata = {"": {"version": 2}}
    state = {
        "int": 7, "neg": -3, "big": 2 ** 80, "int64_edges": [2 ** 63 - 1, -(2 ** 63)],
        "float": 0.1, "neg_zero": -0.0, "inf": float("inf"), "ninf": -math.inf, "nan": float("nan"),
        "tiny": 5e-324, "bool": True, "false": False, "none": None,
        "str": "naïve ✓ \u0000 \"quoted\" \\ $tensor", "empty_str": "",
        "list": [1, [2, [3]], []], "tuple": (1, (2,), ()), "nested": {"a": {"b": {"c": (None,)}}},
        0: "int key", 1.5: "float key", None: "none key", (1, "x"): "tuple key", True: "bool key",
        "-1": "str key that looks like an int", -1: "int key -1",
        "$dict": {"$tensor": "not a tensor"}, "ordered": od, "empty_dict": {},
        "size": torch.Size([2, 3]), "dtype": torch.bfloat16, "device": torch.device("cpu"),
        "mixed": [torch.ones(2), 3, {"t": (torch.zeros(1), "s")}],
    }
    got = roundtrip(root, state)
    assert_same_tree(state, got)
    assert got["ordered"]._metadata == {"": {"version": 2}}
    assert type(got["size"]) is torch.Size and got["dtype"] is torch.bfloat16


def test_optimizer_state_keeps_int_keys(root):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    got = roundtrip(root, {"optim": opt.state_dict()})["optim"]
    assert list(got["state"].keys()) == [0, 1]
    assert got["param_groups"][0]["params"] == [0, 1]
    opt2 = torch.optim.SGD(torch.nn.Linear(3, 2).parameters(), lr=0.5)
    opt2.load_state_dict(got)
    assert opt2.param_groups[0]["lr"] == 0.1


def test_top_level_can_be_any_savable_value(root):
    assert_same_tree([1, (2.5, "x")], roundtrip(root + "1", [1, (2.5, "x")]))
    t = torch.arange(3)
    assert_same_tree(t, roundtrip(root + "2", t))


def test_tensor_names_are_readable(root):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with ckpt.Checkpointer(root) as cp:
        cp.save(1, {"model": model.state_dict(), "o": {"state": {0: {"exp_avg": torch.ones(1)}}},
                    "a.b": torch.ones(1), "a": {"b": torch.ones(1)}})
    names = [t["name"] for t in ckpt.describe(root)["tensors"]]
    assert sorted(names) == sorted(["model.0.weight", "model.0.bias", "o.state.0.exp_avg", "a.b", "a.b~1"])


class Color(enum.Enum):
    RED = 1


class Opaque:
    pass


@pytest.mark.parametrize("value,what", [
    (Opaque(), "Opaque"), (object(), "object"), (lambda: 1, "function"), ({1, 2}, "set"),
    (b"bytes", "bytes"), (fractions.Fraction(1, 3), "Fraction"), (Color.RED, "Color"),
    (collections.defaultdict(int), "defaultdict"), (collections.namedtuple("P", "x")(1), "P"),
    (range(3), "range"), (1 + 2j, "complex"),
])
def test_other_objects_are_refused(root, value, what):
    cp = ckpt.Checkpointer(root)
    with pytest.raises(TypeError, match=f"{what}.*at state\\['inner'\\]\\[0\\].*never pickled"):
        cp.save_async(1, {"inner": [value]})
    cp.save(2, {"ok": 1})  # the refusal did not poison the checkpointer
    cp.close()
    assert ckpt.list_steps(root) == [2]


def test_numpy_values_are_refused(root):
    np = pytest.importorskip("numpy")
    cp = ckpt.Checkpointer(root)
    for value in (np.float64(1.0), np.int64(3), np.zeros(3)):
        with pytest.raises(TypeError, match="never pickled"):
            cp.save_async(1, {"x": value})
    cp.close()


def test_bad_keys_and_cycles_are_refused(root):
    cp = ckpt.Checkpointer(root)
    with pytest.raises(TypeError, match="dict key"):
        cp.save_async(1, {frozenset([1]): 1})
    cyclic = {"a": []}
    cyclic["a"].append(cyclic)
    with pytest.raises(ValueError, match="cycle"):
        cp.save_async(1, cyclic)
    with pytest.raises(ValueError, match="UTF-8"):
        cp.save_async(1, {"s": "\udcff"})
    cp.close()
    assert ckpt.list_steps(root) == []


def test_checkpoint_from_the_cpp_api_loads_as_a_flat_dict(root):
    engine = torch.classes.ckpt.Engine(root)
    torch.ops.ckpt.save_async(engine, 4, ["a.w", "b"], [torch.ones(2), torch.zeros(1)], '{"epoch": 1}').wait()
    got = ckpt.load(root)
    assert list(got) == ["a.w", "b"] and torch.equal(got["a.w"], torch.ones(2))
