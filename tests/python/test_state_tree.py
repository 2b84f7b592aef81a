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


def test_numpy_arrays_and_scalars_round_trip_as_numpy(root):
    # np.random.get_state() (a tuple holding a uint32 array), numpy metrics
    # and arrays of every layout come back as numpy values of the same dtype,
    # shape and bits; a load into= replaces them like any non-tensor leaf.
    np = pytest.importorskip("numpy")
    rng = np.random.RandomState(5)
    state = {
        "np_rng": np.random.RandomState(9).get_state(), "loss": np.float64(0.25), "lr": np.float32(1e-3),
        "count": np.int64(-7), "flag": np.bool_(True), "u": np.uint16(65535),
        "zero_d": np.array(2.5), "grid": np.arange(24, dtype=np.int32).reshape(2, 3, 4),
        "fortran": np.asfortranarray(rng.rand(3, 5)), "strided": np.arange(20.0)[::3],
        "big_endian": np.arange(5, dtype=">i4"), "readonly": np.frombuffer(b"\x01\x02\x03", dtype=np.uint8),
        "complex": np.array([1 + 2j, -0.5j], dtype=np.complex128), "empty": np.zeros((0, 3), np.float16),
        "nan": np.array([np.nan, -0.0, np.inf]),
    }
    got = roundtrip(root, state)
    for key, want in state.items():
        have = got[key]
        if key == "np_rng":
            assert type(have) is tuple and have[0] == want[0] and have[2:] == want[2:]
            have, want = have[1], want[1]
        assert type(have) is type(want), key
        if isinstance(want, np.ndarray):
            assert have.dtype == want.dtype.newbyteorder("=") and have.shape == want.shape, key
            assert have.tobytes() == want.astype(want.dtype.newbyteorder("=")).tobytes(), key
        else:
            assert have.dtype == want.dtype and have.tobytes() == want.tobytes(), key
    restored = np.random.RandomState(0)
    restored.set_state(got["np_rng"])
    assert restored.rand() == np.random.RandomState(9).rand()  # it goes on where it was saved
    into = {"np_rng": np.random.RandomState(1).get_state(), "grid": np.zeros(1), "loss": 0.0}
    ckpt.load(root, into=into, strict=False)
    assert np.array_equal(into["grid"], state["grid"]) and into["loss"] == np.float64(0.25)
    assert np.array_equal(into["np_rng"][1], state["np_rng"][1])
    # The tree says it holds numpy values (a reader that knows none refuses it).
    assert ckpt.describe(root)["extras"]["ckpt.python"]["format"] == 2


def test_numpy_values_that_are_not_numbers_are_refused(root):
    np = pytest.importorskip("numpy")
    cp = ckpt.Checkpointer(root)
    for value, what in ((np.array(["a"]), "<U1"), (np.array([object()]), "object"),
                        (np.datetime64("2026-01-01"), "datetime64"), (np.zeros(2, np.longdouble), "float128")):
        with pytest.raises(TypeError, match=f"at state\\['x'\\].*{what}"):
            cp.save_async(1, {"x": value})
    cp.close()
    assert ckpt.list_steps(root) == []
    with ckpt.Checkpointer(root) as cp:  # a tree with no numpy value stays format 1
        cp.save(1, {"x": 1.5})
    assert ckpt.describe(root)["extras"]["ckpt.python"]["format"] == 1


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
