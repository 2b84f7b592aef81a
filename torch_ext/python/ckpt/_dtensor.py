"""DTensors (torch.distributed.tensor): where this rank's piece lies in the
global tensor, and whether this rank writes it.

A DTensor is a global tensor spread over a device mesh: each mesh dimension
either shards one tensor dimension (`Shard(d)`) or replicates it
(`Replicate()`). The piece a rank holds (its local tensor) is a box of the
global tensor: `local_box` gives its shape and its offset in the global
tensor. A save writes each distinct box once: the rank whose coordinate is 0
on every mesh dimension that replicates (`writes_chunk`). A load fills each
rank's local tensor with its box, whatever mesh and placements saved it.

`Partial` placements (a pending reduction: the local tensors are addends,
not pieces) and strided shards (FSDP2 combined with tensor parallelism,
whose local tensor is not one box) are refused with a TypeError naming the
place. torch.distributed is imported only when a DTensor is met (or asked
about), and is looked up where the installed torch has it.
"""
import functools


@functools.lru_cache(maxsize=None)
def _api():
    """(DTensor class, Shard, Replicate, compute_local_shape_and_global_offset),
    or None if this torch has no DTensor."""
    try:
        from torch.distributed.tensor import DTensor, Replicate, Shard
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    except ImportError:
        try:  # torch < 2.5
            from torch.distributed._tensor import DTensor, Replicate, Shard
            from torch.distributed._tensor._utils import compute_local_shape_and_global_offset
        except ImportError:
            return None
    return DTensor, Shard, Replicate, compute_local_shape_and_global_offset


def is_dtensor(x):
    """Whether `x` is a torch.distributed DTensor. Decided by class name and
    module first, so a state without DTensors imports nothing."""
    for c in type(x).__mro__:
        if c.__name__ == "DTensor" and c.__module__.startswith("torch.distributed"):
            api = _api()
            return api is not None and isinstance(x, api[0])
    return False


def _placement_name(p):
    return type(p).__name__ + (f"({p.dim})" if hasattr(p, "dim") and type(p).__name__ == "Shard"
                               else "()")


def check(dt, where):
    """TypeError unless every placement of `dt` is Shard(d) or Replicate()."""
    _, shard, replicate, _ = _api()
    for i, p in enumerate(dt.placements):
        if type(p) is shard or type(p) is replicate:
            continue
        name = type(p).__name__
        if name == "Partial":
            raise TypeError(
                f"ckpt: {where} is a DTensor with a Partial placement on mesh dimension {i} "
                f"(placements {describe_placements(dt)}): its local tensors are addends of a "
                "pending reduction, not pieces of the tensor; redistribute it first "
                "(dt.redistribute(dt.device_mesh, [Replicate() or Shard(d), ...])) or leave it out")
        raise TypeError(
            f"ckpt: {where} is a DTensor with placement {p!r} on mesh dimension {i}: only "
            "Shard(d) and Replicate() placements are saved and loaded (its local tensor must be "
            "one box of the global tensor); redistribute it first or leave it out")


def describe_placements(dt):
    """Placements as text: ["Shard(0)", "Replicate()"]."""
    return [_placement_name(p) for p in dt.placements]


def local_box(dt):
    """(shape, offset) of this rank's local tensor in the global tensor, each
    one entry per dimension; an empty shape (some entry 0) where this rank
    holds none of it (an uneven shard, or a rank outside the mesh)."""
    compute = _api()[3]
    shape, offset = compute(dt.shape, dt.device_mesh, dt.placements)
    shape = [int(n) for n in shape]
    offset = [int(o) for o in offset] if len(offset) == len(shape) else [0] * len(shape)
    return shape, offset


def local_tensor(dt):
    """The local tensor of `dt` itself (not a copy): what a load writes into."""
    local = getattr(dt, "_local_tensor", None)
    return local if local is not None else dt.to_local()


def writes_chunk(dt):
    """Whether this rank writes `dt`'s chunk on save: it is in the mesh and
    its coordinate is 0 on every mesh dimension that replicates, so each
    distinct box of the global tensor is written by exactly one rank."""
    replicate = _api()[2]
    coordinate = dt.device_mesh.get_coordinate()
    if coordinate is None:
        return False
    return all(c == 0 for c, p in zip(coordinate, dt.placements) if type(p) is replicate)


def mesh_info(dt):
    """What a checkpoint records of `dt`'s layout, for information:
    {"mesh_shape", "mesh_dim_names", "placements"}."""
    mesh = dt.device_mesh
    names = getattr(mesh, "mesh_dim_names", None)
    return {"mesh_shape": [int(n) for n in mesh.shape],
            "mesh_dim_names": list(names) if names else None,
            "placements": describe_placements(dt)}
