"""Ranks of the multi-rank tests (tests/python/test_distributed.py).

`run_world(scenario, world, workdir, ...)` starts `world` processes, each
forked from one forkserver that has torch and ckpt imported (so a rank costs
a fork, not an interpreter start), joins them into a fresh gloo group over
TCP (rank 0 hosts the TCPStore, as with `init_method="tcp://..."` in a real
job), and runs the scenario function of that name on every rank. Each rank
writes its outcome as JSON (the scenario's return value, or the exception it
raised) and its stdout/stderr into `workdir`, then leaves with os._exit: a
rank never runs interpreter teardown or destroys a group whose peers may be
dead. Every rank has a deadline: `run_world` kills the ranks still alive when
it passes (each dumps its threads' stacks into its log first), so a hang is a
failure with a stack, not a stuck test.
"""
# (Over 400 lines: the rank bodies of every scenario of test_distributed.py,
# which the forkserver imports once; each scenario is a short function.)

import datetime
import faulthandler
import importlib
import itertools
import json
import multiprocessing
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import ckpt
from ckpt import _tree
from training import assert_topk_restored

_ctx = None
_runs = itertools.count()


def _context():
    global _ctx
    if _ctx is None:
        # The forkserver imports its preloads before it takes this process's
        # sys.path (Python 3.11 passes it but does not apply it), so without
        # PYTHONPATH it would import an installed ckpt over the tree under
        # test, and this module not at all: it inherits the environment.
        here = os.path.dirname(os.path.abspath(__file__))
        package = os.path.dirname(os.path.dirname(os.path.abspath(ckpt.__file__)))
        paths = [here, package] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        _ctx = multiprocessing.get_context("forkserver")
        _ctx.set_forkserver_preload(["torch", "torch.distributed", "ckpt", __name__])
    return _ctx


def _store(rank, world, port_file, timeout):
    """The group's TCPStore. Rank 0 hosts it on a port the kernel picks as it
    binds and writes that port to `port_file`; the others wait for the file
    (until `timeout`) and connect. (A port found free beforehand and bound
    later could be taken in between by another suite running beside this
    one: EADDRINUSE.)"""
    td = datetime.timedelta(seconds=timeout)
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, timeout=td, wait_for_workers=False)
        with open(port_file + ".tmp", "w") as f:
            f.write(str(store.port))
        os.rename(port_file + ".tmp", port_file)
        return store
    deadline = time.monotonic() + timeout
    while not os.path.exists(port_file):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 did not host the store within {timeout} s ({port_file})")
        time.sleep(0.01)
    with open(port_file) as f:
        port = int(f.read())
    return dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=td)


class World:
    """The outcome of one run: per rank its result (None if it wrote none),
    exit code and log."""

    def __init__(self, results, exitcodes, logs, hung):
        self.results, self.exitcodes, self.logs, self.hung = results, exitcodes, logs, hung

    def value(self, rank):
        """The scenario's return value on `rank`; AssertionError with the
        rank's traceback and log if it raised or died."""
        r = self.results[rank]
        assert r is not None and r["ok"], f"rank {rank} failed:\n{self.describe(rank)}"
        return r["value"]

    def describe(self, rank):
        r = self.results[rank]
        head = (f"exit code {self.exitcodes[rank]}" + (" (hung, killed)" if rank in self.hung else ""))
        body = r["traceback"] if r is not None and not r["ok"] else ""
        return f"{head}\n{body}\n--- log of rank {rank} (tail) ---\n{self.logs[rank][-6000:]}"

    def check(self, expect_dead=()):
        """Every rank not in `expect_dead` finished and returned."""
        for rank in range(len(self.results)):
            if rank not in expect_dead:
                self.value(rank)


def run_world(scenario, world, workdir, timeout=120.0, env=None, **kwargs):
    """Runs scenario `scenario` (a function of this module, or
    "module:function" of another module beside it) on `world` fresh
    ranks; `env` maps a rank to environment variables set in it before it
    starts (e.g. CKPT_KILL_POINT); `kwargs` reach the scenario as attributes
    of its context. Returns a World once every rank ended or `timeout` passed."""
    ctx = _context()
    run = f"{scenario}-{next(_runs)}"
    os.makedirs(workdir, exist_ok=True)
    port_file = os.path.join(workdir, f"{run}-store-port")
    paths = [(os.path.join(workdir, f"{run}-rank{r}.json"), os.path.join(workdir, f"{run}-rank{r}.log"))
             for r in range(world)]
    procs = []
    for r in range(world):
        args = (scenario, r, world, port_file, dict(kwargs, workdir=workdir), paths[r][0], paths[r][1],
                dict((env or {}).get(r, {})), timeout)
        p = ctx.Process(target=_child, args=args, name=f"{run}-rank{r}")
        p.start()
        procs.append(p)
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for r in hung:
        procs[r].kill()
        procs[r].join(10)
    results, logs = [], []
    for result_path, log_path in paths:
        try:
            with open(result_path) as f:
                results.append(json.load(f))
        except (OSError, ValueError):
            results.append(None)
        try:
            with open(log_path, errors="replace") as f:
                logs.append(f.read())
        except OSError:
            logs.append("")
    return World(results, [p.exitcode for p in procs], logs, hung)


class Context:
    def __init__(self, rank, world, **kwargs):
        self.rank, self.world = rank, world
        self.group = dist.group.WORLD
        self.__dict__.update(kwargs)


def _scenario(name):
    """The scenario function `name` of this module, or "module:function" of
    another (e.g. "dtensor_workers:save_sharded")."""
    if ":" in name:
        module, function = name.split(":", 1)
        return getattr(importlib.import_module(module), function)
    return globals()[name]


def _child(scenario, rank, world, port_file, kwargs, result_path, log_path, env, timeout):
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(env)
    faulthandler.dump_traceback_later(max(1.0, timeout - 5), exit=False)
    try:
        dist.init_process_group("gloo", store=_store(rank, world, port_file, timeout), rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=timeout))
        result = {"ok": True, "value": _scenario(scenario)(Context(rank, world, **kwargs))}
    except BaseException as e:  # noqa: BLE001 -- reported to the test
        result = {"ok": False, "type": type(e).__name__, "message": str(e),
                  "traceback": traceback.format_exc()}
    tmp = result_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.rename(tmp, result_path)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# -- comparing states ---------------------------------------------------------

def snapshot(state):
    """What a save of `state` holds: its flattened tree and a copy of each tensor."""
    names, tensors, meta = _tree.flatten(state)
    return {"tree": json.loads(json.dumps(meta)),
            "tensors": {n: t.detach().clone().contiguous() for n, t in zip(names, tensors)}}


def _bits(t):
    t = t.detach().contiguous().cpu()
    return t.reshape(-1).view(torch.uint8) if t.numel() and t.dtype != torch.bool else t


def differences(loaded, snap, tolerances=None, base=None, ratio=None):
    """Where `loaded` (a state) differs from `snap` (a snapshot): [] if its
    tree and every tensor's dtype, shape and bits are the same. `tolerances`
    maps a tensor name to the error bound the engine recorded (lossy top-k
    deltas): such a tensor is checked from the values against `base` (name
    -> the restored tensor of the delta's base; training.assert_topk_restored,
    with `ratio`), and its computed error must be within the bound; others
    must be bit-exact."""
    got = snapshot(loaded)
    out = []
    if got["tree"] != snap["tree"]:
        out.append(f"tree differs: {json.dumps(got['tree'])[:300]} vs {json.dumps(snap['tree'])[:300]}")
    if sorted(got["tensors"]) != sorted(snap["tensors"]):
        out.append(f"tensor names differ: {sorted(got['tensors'])} vs {sorted(snap['tensors'])}")
        return out
    for name, want in snap["tensors"].items():
        have = got["tensors"][name]
        if have.dtype != want.dtype or have.shape != want.shape:
            out.append(f"{name}: {have.dtype}{list(have.shape)} vs {want.dtype}{list(want.shape)}")
            continue
        bound = (tolerances or {}).get(name)
        if bound is None or bound == 0:
            if not torch.equal(_bits(have), _bits(want)):
                out.append(f"{name}: values differ")
            continue
        try:
            error = assert_topk_restored(want, have, base[name], ratio, name)
        except (AssertionError, KeyError, TypeError) as e:
            out.append(f"{name}: not a top-k restore of its base: {e!r}")
            continue
        if error > bound * (1 + 1e-6) + 1e-12:
            out.append(f"{name}: off by {error} > error bound {bound}")
    return out


def _save_snapshots(ctx, tag, snaps):
    torch.save(snaps, os.path.join(ctx.workdir, f"{tag}-snap-rank{ctx.rank}.pt"))


def snapshots_path(workdir, tag, rank):
    return os.path.join(workdir, f"{tag}-snap-rank{rank}.pt")


def _error(e):
    return {"type": type(e).__name__, "code": getattr(e, "code", None), "message": str(e)}


# -- scenarios ------------------------------------------------------------------
# Each runs on every rank with a Context (rank, world, group, workdir and the
# run_world kwargs) and returns something JSON-able.

def _ddp_model():
    torch.manual_seed(0)  # the same initial parameters on every rank
    model = nn.Sequential(nn.Linear(128, 1024), nn.GELU(), nn.Dropout(0.1), nn.Linear(1024, 128))
    ddp = nn.parallel.DistributedDataParallel(model)
    return ddp, torch.optim.AdamW(ddp.parameters(), lr=1e-3)


def _ddp_step(ddp, optim, step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)  # each rank its own batch
    x, y = torch.randn(16, 128, generator=g), torch.randn(16, 128, generator=g)
    optim.zero_grad()
    F.mse_loss(ddp(x), y).backward()  # gradients all-reduced by DDP
    optim.step()


def ddp_training(ctx):
    """DDP-style: model and optimizer replicated, the RNG and a data position
    rank-local; exact deltas between full saves (full_every=3), a real
    training step before each save; then every rank loads each step with the
    group (bit-exact), the newest one, and the newest into a fresh model and
    optimizer."""
    ddp, optim = _ddp_model()
    torch.manual_seed(100 + ctx.rank)  # dropout differs per rank: the RNG is rank-local
    snaps, kinds = {}, {}
    with ckpt.Checkpointer(ctx.root, delta="exact", full_every=3, commit_timeout_s=ctx.commit_timeout,
                           replicated=["model", "optim"], rank_local=["rng", "data"]) as cp:
        assert (cp.rank, cp.world_size) == (ctx.rank, ctx.world)
        for step in range(1, ctx.steps + 1):
            _ddp_step(ddp, optim, step, ctx.rank)
            if step == 1:
                cp.reserve({"model": ddp.module, "optim": optim, "rng": torch.get_rng_state(),
                            "data": {"pos": torch.zeros(1)}}, wait=True)
            state = {"model": ddp.module, "optim": optim, "rng": torch.get_rng_state(),
                     "data": {"pos": torch.tensor([step * 16 + ctx.rank])}, "step": step,
                     "rank": ctx.rank}
            snaps[step] = snapshot(state)
            stats = cp.save(step, state)
            kinds[step] = stats["kind"]
    errors = []
    for step in snaps:
        got = ckpt.load(ctx.root, step=step, process_group=ctx.group)
        errors += [f"step {step}: {d}" for d in differences(got, snaps[step])]
    newest, got = ckpt.load(ctx.root, process_group=ctx.group, with_step=True)
    errors += [f"newest: {d}" for d in differences(got, snaps[ctx.steps])]
    # Into a fresh model and optimizer (stepped once, so it has moments to fill).
    ddp2, optim2 = _ddp_model()
    _ddp_step(ddp2, optim2, 999, ctx.rank)
    into = {"model": ddp2.module, "optim": optim2, "rng": torch.get_rng_state(),
            "data": {"pos": torch.zeros(1, dtype=torch.int64)}, "step": 0, "rank": -1}
    ckpt.load(ctx.root, into=into, process_group=ctx.group)
    errors += [f"into: {d}" for d in differences(into, snaps[ctx.steps])]
    _save_snapshots(ctx, "ddp", snaps)
    return {"errors": errors, "kinds": kinds, "newest": newest,
            "stats": {k: stats.get(k) for k in ("rank", "world_size", "ranks_wait_s",
                                                "commit_latency_s", "tensor_bytes")}}


def fsdp_shards(ctx):
    """FSDP-style: each rank saves its own, different shard — the flat
    parameter shard under the same name on every rank (rank-local), its
    optimizer moment under a name of its own (default placement) — and a
    replicated table; top-k deltas whose changes touch 1 % of the elements
    (within the top-k budget: exact) except one dense step (lossy, within
    the recorded error bound)."""
    n = 1 << 16
    g = torch.Generator().manual_seed(10 + ctx.rank)
    shard, moment = torch.randn(n, generator=g), torch.zeros(n)
    table = torch.zeros(256)
    snaps, kinds = {}, {}
    with ckpt.Checkpointer(ctx.root, delta="topk", topk_ratio=0.05, full_every=10,
                           commit_timeout_s=ctx.commit_timeout, replicated=["table"],
                           rank_local=["model"]) as cp:
        for step in range(1, ctx.steps + 1):
            idx = torch.randperm(n, generator=g)[: n // 100]
            shard[idx] += 0.01 * step
            moment[idx] = float(step)
            if step == ctx.dense_step:
                shard += 1e-3 * torch.randn(n, generator=g)
            table[step] = float(step)  # the same on every rank
            state = {"model": {"flat_shard": shard}, "optim": {f"shard{ctx.rank}": {"exp_avg": moment}},
                     "table": table, "step": step}
            snaps[step] = snapshot(state)
            kinds[step] = cp.save(step, state)["kind"]
    errors = []
    base = None  # the restore of the full save (step 1): every delta's base (differential)
    for step in snaps:
        info = ckpt.describe(ctx.root, step, rank=ctx.rank)
        bounds = {t["name"]: t.get("error_bound", 0) for t in info["tensors"]}
        lossless = step < ctx.dense_step
        if lossless and any(bounds.values()):
            errors.append(f"step {step}: lossy before the dense step: {bounds}")
        if step == ctx.dense_step and not any(bounds.values()):
            errors.append(f"step {step}: the dense step dropped nothing: the lossy check proves nothing")
        got = ckpt.load(ctx.root, step=step, process_group=ctx.group)
        errors += [f"step {step}: {d}" for d in differences(got, snaps[step], bounds, base, 0.05)]
        if kinds[step] == "full":
            base = {n: t.clone() for n, t in snapshot(got)["tensors"].items()}
    into = {"model": {"flat_shard": torch.empty(n)}, "optim": {f"shard{ctx.rank}": {"exp_avg": torch.empty(n)}},
            "table": torch.empty(256), "step": 0}
    ckpt.load(ctx.root, into=into, process_group=ctx.group)
    info = ckpt.describe(ctx.root, ctx.steps, rank=ctx.rank)
    bounds = {t["name"]: t.get("error_bound", 0) for t in info["tensors"]}
    errors += [f"into: {d}" for d in differences(into, snaps[ctx.steps], bounds, base, 0.05)]
    _save_snapshots(ctx, "fsdp", snaps)
    return {"errors": errors, "kinds": kinds}


def _timed_failure(resp, limit):
    """The error `resp` ends with and how long that took (None: it committed)."""
    start = time.monotonic()
    try:
        resp.result(timeout=limit)
    except ckpt.CheckpointError as e:
        return dict(_error(e), elapsed=time.monotonic() - start)
    return None


def failures(ctx):
    """On one group, each on a root of its own: (a) a rank whose save_async
    raises (its save never starts) while the other saves, then a save by
    both; (b) the ranks saving different steps; (c) one name with default
    placement and different bytes on the two ranks, then the same bytes."""
    out = {}
    limit = ctx.commit_timeout + 60
    w = torch.full((4096,), float(ctx.rank))
    os.makedirs(ctx.root, exist_ok=True)

    with ckpt.Checkpointer(os.path.join(ctx.root, "raises"), commit_timeout_s=ctx.commit_timeout,
                           rank_local=True) as cp:
        cp.save(1, {"w": w})
        if ctx.rank == 1:
            try:
                cp.save_async(2, {"w": w, "bad": object()})
                out["raised"] = None
            except TypeError as e:
                out["raised"] = _error(e)
        else:
            out["raised"] = _timed_failure(cp.save_async(2, {"w": w}), limit)
        dist.barrier()
        try:
            cp.save(3, {"w": w})
            out["after"] = None
        except ckpt.CheckpointError as e:
            out["after"] = _error(e)

    with ckpt.Checkpointer(os.path.join(ctx.root, "steps"), commit_timeout_s=ctx.commit_timeout,
                           rank_local=True) as cp:
        out["steps"] = _timed_failure(cp.save_async(10 + ctx.rank, {"w": w}), limit)
        dist.barrier()

    with ckpt.Checkpointer(os.path.join(ctx.root, "conflict"), commit_timeout_s=ctx.commit_timeout) as cp:
        out["conflict"] = _timed_failure(cp.save_async(1, {"w": w}), limit)
        dist.barrier()
        try:
            cp.save(2, {"w": torch.ones(4096)})
            out["same"] = None
        except ckpt.CheckpointError as e:
            out["same"] = _error(e)
    return out


def _kill_state(rank, step):
    g = torch.Generator().manual_seed(step * 10 + rank)
    return {"model": {"w": torch.randn(1 << 20, generator=g)}, "step": step}


def killed(ctx):
    """Saves step 1, then step 2, during which the victim rank dies (its
    CKPT_KILL_POINT); a survivor reports how its save ended."""
    with ckpt.Checkpointer(ctx.root, commit_timeout_s=ctx.commit_timeout, rank_local=True) as cp:
        cp.save(1, _kill_state(ctx.rank, 1))
        dist.barrier()
        failure = _timed_failure(cp.save_async(2, _kill_state(ctx.rank, 2)), ctx.commit_timeout + 60)
    return {"failure": failure}


def restarted(ctx):
    """A fresh group on a root whose last save failed: every rank loads the
    newest checkpoint (step 1), saves step 2, and loads it back."""
    step, got = ckpt.load(ctx.root, process_group=ctx.group, with_step=True)
    errors = [f"resume: {d}" for d in differences(got, snapshot(_kill_state(ctx.rank, 1)))]
    with ckpt.Checkpointer(ctx.root, commit_timeout_s=ctx.commit_timeout, rank_local=True) as cp:
        cp.save(2, _kill_state(ctx.rank, 2))
    again, got = ckpt.load(ctx.root, process_group=ctx.group, with_step=True)
    errors += [f"step 2: {d}" for d in differences(got, snapshot(_kill_state(ctx.rank, 2)))]
    return {"resumed": step, "newest": again, "errors": errors}


def load_fallback(ctx):
    """Loads with the group after the test damaged one rank's part of the
    newest step: every rank must get the same, older, step; asked for the
    damaged step, or loading from an empty root, every rank raises alike."""
    step, _ = ckpt.load(ctx.root, process_group=ctx.group, with_step=True)
    into = {"model": {"w": torch.empty(1 << 20)}, "step": 0}
    step_into, _ = ckpt.load(ctx.root, into=into, process_group=ctx.group, with_step=True)
    missing = damaged = None
    try:
        ckpt.load(ctx.empty_root, process_group=ctx.group)
    except ckpt.CheckpointError as e:
        missing = _error(e)
    try:
        ckpt.load(ctx.root, step=2, process_group=ctx.group)
    except ckpt.CheckpointError as e:
        damaged = _error(e)
    return {"step": step, "step_into": step_into, "missing": missing, "damaged": damaged}
