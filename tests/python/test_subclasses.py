"""Tensor subclasses: ShardedTensor and others are refused up front, naming where
they are; torch.Tensor, nn.Parameter and DTensor are accepted (DTensors on
several ranks: test_dtensor.py). A DTensor with a Partial placement is
refused with a clear error."""
import pytest
import torch

import ckpt


class Tagged(torch.Tensor):
    """A tensor subclass of the kind a library might hand out."""


class ShardedTensor(torch.Tensor):
    """Stands in for torch.distributed's ShardedTensor (matched by name and module)."""


ShardedTensor.__module__ = "torch.distributed._shard.sharded_tensor.api"


def test_subclasses_are_refused_on_save(root):
    cp = ckpt.Checkpointer(root)
    t = torch.ones(3).as_subclass(Tagged)
    with pytest.raises(TypeError, match=r"state\['model'\]\['w'\] is a tensor subclass .*Tagged"):
        cp.save_async(1, {"model": {"w": t}})
    d = torch.ones(3).as_subclass(ShardedTensor)
    with pytest.raises(TypeError, match=r"state\['model'\]\['w'\] is a ShardedTensor: it is not "
                                        r"saved or loaded as such .*DTensor"):
        cp.save_async(1, {"model": {"w": d}, "ok": torch.ones(1)})
    cp.save(2, {"w": torch.nn.Parameter(torch.ones(2)), "t": torch.ones(1)})
    cp.close()
    assert ckpt.list_steps(root) == [2]


def test_subclasses_are_refused_on_load_into(root):
    with ckpt.Checkpointer(root) as cp:
        cp.save(1, {"w": torch.ones(3), "step": 4})
    into = {"w": torch.zeros(3).as_subclass(ShardedTensor), "step": 0}
    with pytest.raises(TypeError, match=r"state\['w'\] is a ShardedTensor"):
        ckpt.load(root, into=into)
    assert into["step"] == 0
    with pytest.raises(TypeError, match=r"state\['w'\] is a tensor subclass"):
        ckpt.load(root, into={"w": torch.zeros(3).as_subclass(Tagged)})
    p = torch.nn.Parameter(torch.zeros(3))
    ckpt.load(root, into={"w": p, "step": 0})
    assert torch.equal(p, torch.ones(3))


@pytest.fixture
def one_rank_mesh():
    """A DeviceMesh of this process alone (a gloo group of one), or skip."""
    dist = pytest.importorskip("torch.distributed")
    try:
        from torch.distributed.tensor import DeviceMesh
    except ImportError:
        pytest.skip("no torch.distributed.tensor (torch < 2.5)")
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("torch.distributed unavailable or already in use")
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        yield DeviceMesh("cpu", [0])
    finally:
        dist.destroy_process_group()


def test_dtensor_on_one_process_is_its_full_tensor(root, one_rank_mesh):
    """A single-process checkpointer saves a DTensor whose local tensor is the
    whole tensor (a 1-rank mesh) as a plain tensor; it loads back as a plain
    tensor, and into a DTensor again."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    with ckpt.Checkpointer(root) as cp:
        cp.save(1, {"model": {"w": distribute_tensor(w, one_rank_mesh, [Shard(1)]),
                              "b": distribute_tensor(w[0], one_rank_mesh, [Replicate()])}})
    info = ckpt.describe(root, 1)
    assert {t["name"]: t["shape"] for t in info["tensors"]} == {"model.w": [3, 4], "model.b": [4]}
    assert info["extras"]["ckpt.python"]["dtensors"]["model.w"] == \
        {"mesh_shape": [1], "mesh_dim_names": None, "placements": ["Shard(1)"]}
    back = ckpt.load(root)
    assert type(back["model"]["w"]) is torch.Tensor and torch.equal(back["model"]["w"], w)
    into = {"model": {"w": distribute_tensor(torch.zeros(3, 4), one_rank_mesh, [Shard(0)]),
                      "b": torch.zeros(4)}}
    state, stats = ckpt.load(root, into=into, with_stats=True)
    assert torch.equal(state["model"]["w"].to_local(), w)
    assert torch.equal(state["model"]["b"], w[0])
    assert stats["step"] == 1 and stats["bytes_loaded"] == 64
    assert stats["bytes_read"] is not None and stats["bytes_read"] >= 64


def test_partial_dtensor_is_refused(root, one_rank_mesh):
    from torch.distributed.tensor import DTensor, Partial
    d = DTensor.from_local(torch.ones(4), one_rank_mesh, [Partial()])
    with ckpt.Checkpointer(root) as cp:
        with pytest.raises(TypeError, match=r"state\['model'\]\['w'\] is a DTensor with a Partial "
                                            r"placement .*redistribute"):
            cp.save_async(1, {"model": {"w": d}})
        cp.save(1, {"model": {"w": torch.ones(4)}})
    with pytest.raises(TypeError, match=r"state\['model'\]\['w'\] is a DTensor with a Partial"):
        ckpt.load(root, into={"model": {"w": d}})
