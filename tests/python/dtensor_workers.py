"""Ranks of tests/python/test_dtensor.py, run through distributed_workers.run_world
("dtensor_workers:<scenario>").

Every rank builds the same global tensors from seeds (random bytes, so every
bit pattern of every dtype is exercised, NaNs included), takes its box of
each as a DTensor's local tensor, saves, or loads into DTensors of another
layout and compares each element's bits with the global tensor's.
"""
import zlib

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.device_mesh import init_device_mesh

import ckpt
from ckpt import _dtensor, _tree

# Shapes not divisible by the rank counts of the tests (1..4), 1-D to 3-D.
SHAPES = {"13x7": [13, 7], "5": [5], "6x5x3": [6, 5, 3]}
BIG = [4096, 2048]  # float32, 32 MiB: large against the 256 KiB blocks of partial reads
GRIDS = {"grid_a": ([10, 9], torch.float32), "grid_b": ([7, 6], torch.int32),
         "grid_c": ([9, 4], torch.bfloat16)}


def dtypes():
    return sorted(_tree.SAVABLE_DTYPES, key=str)


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def global_tensor(name, shape, dtype, step):
    """The global tensor `name` as of `step`: random bytes at step 1; from
    then on every 97th element changes each step (so exact deltas store
    little)."""
    def rand(seed):
        g = torch.Generator().manual_seed(seed)
        n = 1
        for d in shape:
            n *= d
        if dtype == torch.bool:
            return torch.randint(0, 2, (n,), generator=g).bool()
        size = torch.empty((), dtype=dtype).element_size()
        return torch.randint(0, 256, (n * size,), generator=g, dtype=torch.uint8).view(dtype)

    seed = zlib.crc32(name.encode())
    flat = rand(seed)
    for s in range(2, step + 1):
        flat[::97] = rand(seed + 1000 * s)[::97]
    return flat.reshape(shape)


def global_state(step):
    """{name: global tensor} of every tensor the tests save (flattened names)."""
    out = {f"t.{_dtype_name(d)}_{k}": global_tensor(f"{d}_{k}", s, d, step)
           for d in dtypes() for k, s in SHAPES.items()}
    out["big"] = global_tensor("big", BIG, torch.float32, step)
    for name, (shape, dtype) in GRIDS.items():
        out[name] = global_tensor(name, shape, dtype, step)
    return out


def box(shape, mesh, placements):
    """(local shape, global offset) of this rank."""
    return _dtensor._api()[3](shape, mesh, placements)


def part(full, mesh, placements):
    """This rank's box of global tensor `full` under `placements` on `mesh`."""
    shape, offset = box(full.shape, mesh, placements)
    if len(offset) != full.dim():  # a rank outside the mesh: nothing
        return full[tuple(slice(0, 0) for _ in shape)]
    return full[tuple(slice(o, o + n) for o, n in zip(offset, shape))]


def make_dtensor(full, mesh, placements):
    """A DTensor of global tensor `full` laid out by `placements` on `mesh`,
    its local tensor this rank's box (no communication)."""
    local = part(full, mesh, placements).clone()
    return DTensor.from_local(local, mesh, placements, run_check=False, shape=full.shape,
                              stride=full.stride())


def _bits(t):
    t = t.contiguous()
    return t.reshape(-1).view(torch.uint8) if t.dtype != torch.bool and t.numel() else t.reshape(-1)


def layout(name, full, layout_name, mesh1, mesh2):
    """(mesh, placements) of tensor `name` in layout `layout_name`."""
    one_d = full.dim() < 2
    if layout_name == "shard0":
        return mesh1, [Shard(0)]
    if layout_name == "shard1":
        return mesh1, [Shard(0) if one_d else Shard(1)]
    if layout_name == "replicate":
        return mesh1, [Replicate()]
    if layout_name == "2d":  # a 2x2 mesh, both dims sharding where the tensor has two
        return mesh2, [Shard(0), Replicate()] if one_d else [Shard(1), Shard(0)]
    raise ValueError(layout_name)


def nest(flat):
    """{"t": {...}, "big": ..., ...} from flattened names ("t.x" -> ["t"]["x"])."""
    out = {}
    for name, v in flat.items():
        head, _, tail = name.partition(".")
        if tail:
            out.setdefault(head, {})[tail] = v
        else:
            out[head] = v
    return out


def _meshes(ctx):
    mesh1 = init_device_mesh("cpu", (ctx.world,))
    mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp")) if ctx.world == 4 else None
    return mesh1, mesh2


def save_sharded(ctx):
    """4 ranks: steps 1 (full) and 2 (exact delta) of every tensor as
    Shard(0) DTensors on a 1-D mesh, the grids on a 2x2 mesh, with a
    replicated plain tensor and plain values."""
    mesh1, mesh2 = _meshes(ctx)
    grid_layouts = {"grid_a": [Shard(0), Shard(1)], "grid_b": [Replicate(), Shard(0)],
                    "grid_c": [Shard(1), Replicate()]}
    kinds = {}
    with ckpt.Checkpointer(ctx.root, process_group=ctx.group, delta="exact", replicated=True,
                           commit_timeout_s=60) as cp:
        for step in (1, 2):
            flat = {}
            for name, full in global_state(step).items():
                if name in grid_layouts:
                    flat[name] = make_dtensor(full, mesh2, grid_layouts[name])
                else:
                    flat[name] = make_dtensor(full, mesh1, [Shard(0)])
            state = nest(flat)
            state["plain"] = torch.arange(10, dtype=torch.int64) * step
            state["step"] = step
            kinds[step] = cp.save(step, state)["kind"]
    return {"kinds": kinds}


def load_resharded(ctx):
    """M ranks: load step `ctx.step` into DTensors of every layout in
    `ctx.layouts`; returns the mismatches and per layout the bytes read for
    the big tensor alone and the bytes its box needs."""
    mesh1, mesh2 = _meshes(ctx)
    want = global_state(ctx.step)
    mismatches, big = [], {}
    for i, layout_name in enumerate(ctx.layouts):
        flat = {}
        for name, full in want.items():
            mesh, placements = layout(name, full, layout_name, mesh1, mesh2)
            flat[name] = make_dtensor(torch.zeros_like(full), mesh, placements)
        into = nest(flat)
        into["plain"], into["step"] = torch.zeros(10, dtype=torch.int64), 0
        step = None if i == 0 else ctx.step  # the first one agrees on the newest step
        chosen, _, stats = ckpt.load(ctx.root, step=step, into=into, process_group=ctx.group,
                                     with_step=True, with_stats=True)
        if chosen != ctx.step or into["step"] != ctx.step:
            mismatches.append(f"{layout_name}: loaded step {chosen}, step value {into['step']}")
        if not torch.equal(into["plain"], torch.arange(10) * ctx.step):
            mismatches.append(f"{layout_name}: plain differs")
        for name, dt in flat.items():
            expected = part(want[name], dt.device_mesh, dt.placements)
            if dt.to_local().shape != expected.shape or \
                    not torch.equal(_bits(dt.to_local()), _bits(expected)):
                mismatches.append(f"{layout_name}: {name} (rank {ctx.rank}, "
                                  f"box {box(dt.shape, dt.device_mesh, dt.placements)})")
        # The big tensor alone, of step 1 (a full save: a delta's records are
        # read whole, with their base's): what reading its box costs.
        mesh, placements = layout("big", want["big"], layout_name, mesh1, mesh2)
        alone = {"big": make_dtensor(torch.zeros(BIG), mesh, placements)}
        _, stats = ckpt.load(ctx.root, step=1, into=alone, process_group=ctx.group,
                             with_stats=True)
        local = alone["big"].to_local()
        if not torch.equal(_bits(local), _bits(part(global_tensor("big", BIG, torch.float32, 1),
                                                    mesh, placements))):
            mismatches.append(f"{layout_name}: big alone differs")
        big[layout_name] = {"bytes_read": stats["bytes_read"], "needed": local.numel() * 4,
                            "bytes_loaded": stats["bytes_loaded"]}
    return {"mismatches": mismatches, "big": big}


# -- tied DTensors ----------------------------------------------------------------

TIED = [10, 6]


def save_tied(ctx):
    """Steps 1 (full) and 2 (exact delta) of a state in which one Shard(0)
    DTensor appears twice (tied weights), on a 1-D mesh of `ctx.world` ranks."""
    mesh, _ = _meshes(ctx)
    kinds = {}
    with ckpt.Checkpointer(ctx.root, process_group=ctx.group, delta="exact", commit_timeout_s=60) as cp:
        for step in (1, 2):
            tied = make_dtensor(global_tensor("tied", TIED, torch.float32, step), mesh, [Shard(0)])
            other = make_dtensor(global_tensor("other", [7], torch.float32, step), mesh, [Shard(0)])
            kinds[step] = cp.save(step, {"model": {"emb": tied, "other": other, "head": tied}})["kind"]
    return {"kinds": kinds}


def load_tied(ctx):
    """Loads step 2 into a tied DTensor of another layout (Shard(1)) on
    `ctx.world` ranks; returns whether its box is bit-exact."""
    mesh, _ = _meshes(ctx)
    tied = make_dtensor(torch.zeros(TIED), mesh, [Shard(1)])
    other = make_dtensor(torch.zeros(7), mesh, [Replicate()])
    ckpt.load(ctx.root, step=2, into={"model": {"emb": tied, "other": other, "head": tied}},
              process_group=ctx.group)
    want = part(global_tensor("tied", TIED, torch.float32, 2), mesh, [Shard(1)])
    return {"exact": torch.equal(_bits(tied.to_local()), _bits(want)),
            "other": torch.equal(_bits(other.to_local()), _bits(global_tensor("other", [7], torch.float32, 2)))}


# -- FSDP2 -----------------------------------------------------------------------

FSDP_BATCH = 8  # the global batch: every rank count of the tests divides it


def fully_shard_api():
    """torch's FSDP2 fully_shard, or None where this torch has none."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        try:  # torch 2.4, 2.5
            from torch.distributed._composable.fsdp import fully_shard
        except ImportError:
            return None
    return fully_shard


def fsdp_model(seed):
    torch.manual_seed(seed)
    # Output sizes not divisible by 4, so some shards are uneven or empty.
    return torch.nn.Sequential(torch.nn.Linear(12, 30), torch.nn.Tanh(), torch.nn.Linear(30, 3))


def fsdp_batch(step):
    g = torch.Generator().manual_seed(500 + step)
    return torch.randn(FSDP_BATCH, 12, generator=g), torch.randn(FSDP_BATCH, 3, generator=g)


def fsdp_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.1)


def fsdp_train_step(model, optimizer, step, rank, world):
    """One step on this rank's slice of the global batch; returns the global
    batch's mean loss (the ranks' slices are equal, so their mean)."""
    x, y = fsdp_batch(step)
    n = FSDP_BATCH // world
    loss = torch.nn.functional.mse_loss(model(x[rank * n:(rank + 1) * n]), y[rank * n:(rank + 1) * n])
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    total = loss.detach().clone()
    if world > 1:
        dist.all_reduce(total)
    return total.item() / world


def reference_losses(steps):
    """The same training unsharded, on one process: the losses of steps 1..steps."""
    model = fsdp_model(0)
    optimizer = fsdp_optimizer(model)
    return [fsdp_train_step(model, optimizer, s, 0, 1) for s in range(1, steps + 1)]


def _sharded_model(ctx, seed):
    fully_shard = fully_shard_api()
    mesh = init_device_mesh("cpu", (ctx.world,))
    model = fsdp_model(seed)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, fsdp_optimizer(model)


def fsdp_train(ctx):
    """Trains `ctx.steps` steps sharded over the ranks, saving model and
    optimizer (get_state_dict's DTensors) after step `ctx.save_at`."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model, optimizer = _sharded_model(ctx, 0)
    losses = []
    with ckpt.Checkpointer(ctx.root, process_group=ctx.group, replicated=True,
                           commit_timeout_s=60) as cp:
        for step in range(1, ctx.steps + 1):
            losses.append(fsdp_train_step(model, optimizer, step, ctx.rank, ctx.world))
            if step == ctx.save_at:
                model_sd, optim_sd = get_state_dict(model, optimizer)
                cp.save(step, {"model": model_sd, "optim": optim_sd, "step": step})
    return {"losses": losses}


def fsdp_resume(ctx):
    """Builds the model afresh (other weights) sharded over this group,
    loads the newest checkpoint into its and the optimizer's state dicts and
    trains on up to step `ctx.steps`."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    model, optimizer = _sharded_model(ctx, 1)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "step": 0}
    _, stats = ckpt.load(ctx.root, into=state, process_group=ctx.group, with_stats=True)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    losses = [fsdp_train_step(model, optimizer, step, ctx.rank, ctx.world)
              for step in range(state["step"] + 1, ctx.steps + 1)]
    return {"resumed": state["step"], "losses": losses, "bytes_read": stats["bytes_read"]}
