"""Tensor subclasses (DTensor, ShardedTensor, others) are refused up front, naming
where they are; torch.Tensor and nn.Parameter are accepted."""
import pytest
import torch

import ckpt


class Tagged(torch.Tensor):
    """A tensor subclass of the kind a library might hand out."""


class DTensor(torch.Tensor):
    """Stands in for torch.distributed's DTensor (matched by name and module)."""


DTensor.__module__ = "torch.distributed.tensor._api"


def test_subclasses_are_refused_on_save(root):
    cp = ckpt.Checkpointer(root)
    t = torch.ones(3).as_subclass(Tagged)
    with pytest.raises(TypeError, match=r"state\['model'\]\['w'\] is a tensor subclass .*Tagged"):
        cp.save_async(1, {"model": {"w": t}})
    d = torch.ones(3).as_subclass(DTensor)
    with pytest.raises(TypeError, match=r"state\['model'\]\['w'\] is a DTensor: it is not "
                                        r"saved as such .*to_local\(\)"):
        cp.save_async(1, {"model": {"w": d}, "ok": torch.ones(1)})
    cp.save(2, {"w": torch.nn.Parameter(torch.ones(2)), "t": torch.ones(1)})
    cp.close()
    assert ckpt.list_steps(root) == [2]


def test_subclasses_are_refused_on_load_into(root):
    with ckpt.Checkpointer(root) as cp:
        cp.save(1, {"w": torch.ones(3), "step": 4})
    into = {"w": torch.zeros(3).as_subclass(DTensor), "step": 0}
    with pytest.raises(TypeError, match=r"state\['w'\] is a DTensor"):
        ckpt.load(root, into=into)
    assert into["step"] == 0
    with pytest.raises(TypeError, match=r"state\['w'\] is a tensor subclass"):
        ckpt.load(root, into={"w": torch.zeros(3).as_subclass(Tagged)})
    p = torch.nn.Parameter(torch.zeros(3))
    ckpt.load(root, into={"w": p, "step": 0})
    assert torch.equal(p, torch.ones(3))


def test_real_dtensor_is_refused(root):
    dist = pytest.importorskip("torch.distributed")
    try:
        from torch.distributed.tensor import DeviceMesh, Replicate, distribute_tensor
    except ImportError:
        pytest.skip("no torch.distributed.tensor (torch < 2.5)")
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("torch.distributed unavailable or already in use")
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        mesh = DeviceMesh("cpu", [0])
        d = distribute_tensor(torch.ones(4), mesh, [Replicate()])
        cp = ckpt.Checkpointer(root)
        with pytest.raises(TypeError, match=r"state\['model'\]\['w'\] is a DTensor"):
            cp.save_async(1, {"model": {"w": d}})
        cp.close()
    finally:
        dist.destroy_process_group()
