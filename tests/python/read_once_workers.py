"""Ranks of the read-once restore tests (test_distributed.py): a DDP-style
state saved by a group, loaded back with the group, each replicated tensor
read from storage by one rank and broadcast to the others."""
import os
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import ckpt
from distributed_workers import differences, snapshot


class _Model(nn.Module):
    """A large embedding (tied to the output layer), a few blocks, BatchNorm
    buffers and many tiny parameters (the packed path of the broadcasts)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)  # the same initial parameters on every rank
        self.embed = nn.Embedding(4096, 128)
        self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128))
                                      for _ in range(3)])
        self.norm = nn.BatchNorm1d(128)
        self.scales = nn.ParameterList([nn.Parameter(torch.ones(3)) for _ in range(300)])
        self.head = nn.Linear(128, 4096, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x):
        h = self.norm(self.blocks(self.embed(x)).mean(1))
        h = h * torch.stack([p.sum() for p in self.scales]).mean()
        return self.head(h)


def _step(ddp, optim, step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randint(0, 4096, (8, 6), generator=g)
    optim.zero_grad()
    F.cross_entropy(ddp(x), x[:, 0]).backward()
    optim.step()


class _Opens:
    """Counts the openings of a checkpoint in this process while it is
    entered: every op and class of torch.ops.ckpt / torch.classes.ckpt that
    opens one, wrapped."""
    OPS = ("read", "read_into", "read_regions", "describe", "verify")

    def __enter__(self):
        self.count, self._saved = 0, {}

        def counted(fn):
            def wrapper(*args, **kwargs):
                self.count += 1
                return fn(*args, **kwargs)
            return wrapper
        for name in self.OPS:
            self._saved[("ops", name)] = getattr(torch.ops.ckpt, name)
            setattr(torch.ops.ckpt, name, counted(self._saved[("ops", name)]))
        self._saved[("classes", "StepReader")] = torch.classes.ckpt.StepReader
        torch.classes.ckpt.StepReader = counted(self._saved[("classes", "StepReader")])
        return self

    def __exit__(self, *exc):
        for (where, name), fn in self._saved.items():
            setattr(torch.ops.ckpt if where == "ops" else torch.classes.ckpt, name, fn)


def _loads(ctx, root, snaps, step, **kwargs):
    """Loads step `step` (None: the newest) fresh and into a new model with
    the group; returns (errors, [stats of each load], steps loaded)."""
    errors, stats, chosen = [], [], []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with _Opens() as opens:
            s, got, st = ckpt.load(root, step=step, process_group=ctx.group, with_step=True,
                                   with_stats=True, **kwargs)
        errors += [f"fresh {s}: {d}" for d in differences(got, snaps[s])]
        st["opens"] = opens.count
        stats.append(st)
        chosen.append(s)
        model = _Model()
        ddp = nn.parallel.DistributedDataParallel(model)
        optim = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
        _step(ddp, optim, 999, ctx.rank)  # moments to fill
        # A destination that is not contiguous: a transposed view of its own memory.
        odd = torch.zeros(128, 512).t()
        into = {"model": model, "optim": optim, "rng": torch.get_rng_state(), "step": 0, "rank": -1}
        with _Opens() as opens:
            s, _, st = ckpt.load(root, step=step, into=into, process_group=ctx.group, with_step=True,
                                 with_stats=True, **kwargs)
        errors += [f"into {s}: {d}" for d in differences(into, snaps[s])]
        st["opens"] = opens.count
        if model.head.weight.data_ptr() != model.embed.weight.data_ptr():
            errors.append("into: the tied weights came apart")
        stats.append(st)
        chosen.append(s)
        name = "model.blocks.0.0.weight"
        want = snaps[s]["tensors"][name]
        s2, _ = ckpt.load(root, step=s, into={"model": {"blocks.0.0.weight": odd}},
                          process_group=ctx.group, with_step=True, strict=False, **kwargs)
        if not torch.equal(odd, want):
            errors.append("a non-contiguous destination did not get its values")
    return errors, stats, chosen, [str(w.message) for w in seen]


def read_once(ctx):
    """Saves 3 steps (full, exact delta, full), loads them with the group
    (read once, and read_once=False), then the test's damage: rank 0 damages
    a replicated record of step 3 that rank 1 reads, and every rank must
    fall back to step 2 alike."""
    model = _Model()
    ddp = nn.parallel.DistributedDataParallel(model)
    optim = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    snaps = {}
    with ckpt.Checkpointer(ctx.root, delta="exact", full_every=2, commit_timeout_s=60,
                           replicated=["model", "optim"], rank_local=["rng"]) as cp:
        for step in (1, 2, 3):
            _step(ddp, optim, step, ctx.rank)
            for b in model.buffers():  # BatchNorm's running stats, as DDP syncs them at the next forward
                dist.broadcast(b, 0)
            state = {"model": model, "optim": optim, "rng": torch.get_rng_state(), "step": step,
                     "rank": ctx.rank}
            snaps[step] = snapshot(state)
            cp.save(step, state)
    out = {"errors": [], "loads": {}}
    for step in (1, 2, 3):
        errors, stats, chosen, seen = _loads(ctx, ctx.root, snaps, step)
        out["errors"] += errors
        out["loads"][step] = stats
    errors, stats, _, _ = _loads(ctx, ctx.root, snaps, 3, read_once=False)
    out["errors"] += [f"read_once=False: {e}" for e in errors]
    out["loads"]["all_read"] = stats
    # Damage: a replicated tensor of step 3 that rank 1 reads for the group.
    dist.barrier()
    if ctx.rank == 0:
        from ckpt._read_once import readers
        info = ckpt.describe(ctx.root, 3)
        rep = {t["name"]: t for t in info["tensors"] if t["placement"] == "replicated"}
        by = readers(list(rep), {n: t["raw_bytes"] for n, t in rep.items()}, ctx.world)
        t = next(rep[n] for n in sorted(rep) if by[n] == 1 and rep[n]["raw_bytes"] > 8192)
        with open(os.path.join(info["dir"], t["shard"]), "r+b") as f:
            f.seek(t["offset"] + 4096)
            byte = f.read(1)
            f.seek(t["offset"] + 4096)
            f.write(bytes([byte[0] ^ 0xFF]))
        out["damaged"] = t["name"]
    dist.barrier()
    errors, stats, chosen, seen = _loads(ctx, ctx.root, snaps, None)
    out["errors"] += [f"after damage: {e}" for e in errors]
    out["fallback"] = {"steps": chosen, "warnings": seen}
    try:
        ckpt.load(ctx.root, step=3, process_group=ctx.group)
        out["damaged_step"] = None
    except ckpt.CheckpointError as e:
        out["damaged_step"] = {"type": type(e).__name__, "message": str(e)}
    return out


def wider_values(ctx):
    """Replicated complex (a RoPE table, a 16 MiB complex128 tensor), float8
    and numpy values and a rank-local numpy RNG state, saved full then as an
    exact delta by the group, loaded back with read_once on and off: every
    rank's values, bit for bit."""
    import numpy as np
    g = torch.Generator().manual_seed(0)
    model = {"freqs_cis": torch.polar(torch.ones(512, 64), torch.randn(512, 64, generator=g)),
             "big": torch.randn(1 << 20, generator=g, dtype=torch.complex128),
             "w8": torch.randn(256, 256, generator=g).to(torch.float8_e5m2),
             "table": np.arange(1000.0).reshape(10, 100), "lr": np.float32(3e-4)}
    rng = {"numpy": np.random.RandomState(ctx.rank).get_state(), "rank": ctx.rank}
    steps = {1: dict(model), 2: dict(model, freqs_cis=model["freqs_cis"] * 1j, lr=np.float32(1e-4))}
    with ckpt.Checkpointer(ctx.root, delta="exact", commit_timeout_s=60, replicated=["model"],
                           rank_local=["rng"]) as cp:
        for step, m in steps.items():
            cp.save(step, {"model": m, "rng": rng})
    errors = []
    for step, want in steps.items():
        for read_once in (True, False):
            got = ckpt.load(ctx.root, step=step, process_group=ctx.group, read_once=read_once)
            where = f"step {step}, read_once={read_once}"
            for name, value in want.items():
                have = got["model"][name]
                if isinstance(value, (np.ndarray, np.generic)):
                    same = type(have) is type(value) and have.dtype == value.dtype and \
                        have.tobytes() == value.tobytes()
                else:
                    same = have.dtype == value.dtype and torch.equal(have.view(torch.uint8),
                                                                       value.view(torch.uint8))
                if not same:
                    errors.append(f"{where}: model.{name} differs")
            if not (np.array_equal(got["rng"]["numpy"][1], rng["numpy"][1]) and got["rng"]["rank"] == ctx.rank):
                errors.append(f"{where}: this rank's numpy RNG state differs")
    dtypes = {t["name"]: t["dtype"] for t in ckpt.describe(ctx.root, 2)["tensors"]}
    return {"errors": errors, "dtypes": dtypes}
