"""ckpt.load and friends: reading checkpoints back into a nested state."""
# (The multi-rank agreement is in _dist_load.py; what a load into a state
# does, worked out before anything is read, in _into_plan.py.)

import json
import warnings

import torch

from . import _dist_load, _distributed, _lib, _read_once, _tree
from ._into_plan import GLOBAL_PLACEMENTS, IntoPlan, dtype_of
from .checkpointer import EXTRAS_KEY
from .errors import CheckpointError, translate, wrap



class SkippedCheckpointWarning(RuntimeWarning):
    """A newer checkpoint did not read back intact and an older one was used."""


def list_steps(root):
    """Steps of the committed checkpoints in `root`, ascending."""
    _lib.load()
    with translate():
        return list(torch.ops.ckpt.list_steps(str(root)))


def describe(root, step=None, rank=None):
    """The manifest of checkpoint `step` (default: the newest whose manifest
    verifies) as a dict: step, dir, world_size, rank, extras, tensors [{name,
    dtype, shape, placement, rank, ...}]. Reads no tensor data. A multi-rank
    checkpoint: rank r's part (its own tensors and the replicated ones, and
    its extras), or with rank=None all of it (replicated tensors under their
    names, every other one as "rank<r>/<name>")."""
    _lib.load()
    with translate():
        return json.loads(torch.ops.ckpt.describe(str(root), None if step is None else _tree.as_step(step),
                                                  _rank(rank)))


def verify(root, step, rank=None):
    """Reads every record of checkpoint `step` (rank r's part only, with
    rank=r) and checks every checksum; raises CorruptCheckpointError naming
    the file and tensor if one fails."""
    _lib.load()
    with translate():
        torch.ops.ckpt.verify(str(root), _tree.as_step(step), _rank(rank))


def _rank(rank):
    if rank is None:
        return None
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"ckpt: rank must be None, a rank >= 0 or \"all\", got {rank!r}")
    return int(rank)


def load(root, step=None, into=None, with_step=False, strict=None, process_group=None, rank=None,
         with_stats=False, read_once=True):
    """Reads checkpoint `step` of `root`; returns the saved structure, or
    updates `into` in place and returns it.

    step: None means the newest checkpoint that reads back completely and
        verifies; a newer one that does not is skipped with a
        SkippedCheckpointWarning naming it and why.
    into: an existing state, updated in place like
        torch.distributed.checkpoint.load does (see docs/python.md, "Loading
        into an existing state"): each saved tensor is copied into the tensor
        at its place in `into` (any device; dtype and shape must match, else
        TypeError/ValueError, checked before anything is read); every other
        value at a place the checkpoint has (ints, floats, strings, None,
        lists without tensors, ...) is replaced in its container by the saved
        value (a tuple holding tensors is rebuilt and replaced in its parent);
        an object with state_dict()/load_state_dict() (nn.Module, optimizer,
        LR scheduler, ...) is loaded through its state_dict() and then given
        the result with load_state_dict(). Returns `into` itself. If a newer
        checkpoint fails part-way, its tensors may hold some of its data until
        an older one overwrites them; if every checkpoint fails their contents
        are unspecified (non-tensor values are only replaced after a
        successful read). A DTensor in `into` (any mesh, Shard(d) or
        Replicate() placements) gets its local tensor filled with its box of
        the saved global tensor, read from only the chunks that overlap it.
    strict: how keys of `into` and of the checkpoint must match (only with
        `into`). None (default, as torch.distributed.checkpoint.load): a place
        of `into` the checkpoint lacks raises ValueError naming it; places only
        the checkpoint has are ignored. True: a mismatch in either direction
        raises ValueError naming the places. False: what both have is loaded,
        the rest of `into` is left as it is. Inside a stateful object other
        than an nn.Module (an optimizer has no state for a parameter before
        its first step), saved entries its state_dict() lacks are added and
        handed to its load_state_dict(), in every mode.
    with_step: return (step, state) instead of state.
    with_stats: also return this load's statistics, last: (state, stats) or
        (step, state, stats). stats: {"step", "bytes_loaded" (bytes of the
        tensors, or of the DTensors' boxes, filled or returned), "bytes_read"
        (bytes read from shard files, block rounding included, as the reader
        counted them; None where it was not counted: loads without a DTensor
        in `into` and without read_once)}; read_once loads add
        "bytes_received" (tensor bytes this rank got from other ranks) and
        "shared_tensors" (how many tensors were read once for the group).
    process_group: load this rank's part of a multi-rank checkpoint on every
        rank of the group (a collective: every rank must call it). The step is
        the same on every rank: the newest one every rank can read its part
        of (or `step`); an error on any rank is raised on every rank. A
        checkpoint written by another number of ranks (resharding) loads
        its global tensors (DTensors' and replicated ones) on every rank,
        through rank 0's part; tensors of a rank's own (rank-local, default)
        are refused there.
    read_once: with a process group that can broadcast CPU tensors (gloo,
        or "cpu:gloo,cuda:nccl") and a checkpoint of as many ranks, each
        replicated tensor every rank loads into CPU memory is read from
        storage by one rank and broadcast to the others, overlapped with the
        reads (a DDP state is read once in total, not once per rank; see
        docs/distributed.md, "Reading back"). False: every rank reads its
        whole part itself.
    rank: without a group, which part of a multi-rank checkpoint to load: a
        rank r (its own tensors and the replicated ones, as that rank saved
        them), or "all" ({rank: state} for every rank; no `into`). With
        neither, a multi-rank checkpoint loads as one process's (resharding,
        as above): allowed for its global tensors only.

    Without `into`, returns the saved structure with its key types (int keys
    of optimizer state stay int), containers (tuple vs list, OrderedDict) and
    non-tensor leaves exactly as saved; tensors are new CPU tensors; stateful
    objects come back as the state_dict they were saved as. A checkpoint
    written by the C++ API (no saved structure) comes back as a dict
    {tensor name: tensor}.
    """
    _lib.load()
    root = str(root)
    step = None if step is None else _tree.as_step(step)
    stats = {"step": None, "bytes_loaded": 0, "bytes_read": None}
    if strict is not None and type(strict) is not bool:
        raise ValueError(f"ckpt: strict must be None, True or False, got {strict!r}")
    if process_group is not None:
        if rank is not None:
            raise ValueError("ckpt: load takes process_group or rank, not both (with a group, each "
                             "rank loads its own part)")
        def load_part(s, part):
            if into is None:
                return _read_part(root, s, part, stats)[1]
            return _load_into(root, s, into, strict, part, stats)[1]

        group = _distributed.check_group(process_group)
        if read_once and group.size() > 1 and _read_once.usable(group):
            chosen, state = _load_shared(root, step, group, into, strict, stats)
        else:
            chosen, state = _dist_load.load_with_group(
                root, step, group, load_part,
                lambda s: describe(root, s).get("world_size", 1),
                lambda attempt, bound, who: newest_that_reads(root, attempt, bound, who=who))
    elif isinstance(rank, str) and rank == "all":
        if into is not None:
            raise ValueError('ckpt: rank="all" returns {rank: state}; it does not load into a state '
                             "(load each rank's part with rank=r)")
        chosen, state = _load_all_ranks(root, step, stats)
    elif into is None:
        chosen, state = _read_part(root, step, _rank(rank), stats)
    else:
        chosen, state = _load_into(root, step, into, strict, _rank(rank), stats)
    out = (chosen, state) if with_step else (state,)
    if with_stats:
        stats["step"] = chosen
        return out + (stats,)
    return out if with_step else state


def _load_shared(root, step, group, into, strict, stats):
    """(step, state) of a load with `group` that reads each replicated tensor
    once for the group (_read_once); a checkpoint of another number of ranks
    loads as without sharing (its global tensors on every rank)."""
    rank, world = group.rank(), group.size()
    state_dicts = {}

    def open_own(s):  # (the world size of `s`, this rank's StepReader of it or why it has none)
        try:
            with translate():
                reader = torch.classes.ckpt.StepReader(root, s, rank)
            return reader.world_size(), reader
        except CheckpointError as e:
            if rank == 0:  # rank 0 is in every checkpoint: its failure is the step's
                raise
            return None, e  # a step of fewer ranks, or a damaged part: rank 0's world tells which

    def attempt(s):
        worlds, opened = _dist_load.collective(group, root, lambda: open_own(s))
        if worlds[0] != world:  # resharding: every rank its own reads
            got = {}
            state = (_read_part(root, s, None, got)[1] if into is None
                     else _load_step_into(root, s, into, strict, state_dicts, None, got))
            stats.update(got)
            return state
        if None in worlds:  # a rank that should have its part could not open it: every rank raises

            def reraise():
                if isinstance(opened, Exception):
                    raise opened
                return None, None
            _dist_load.collective(group, root, reraise)
        state, shared = _read_once.load_step(group, root, s, lambda: _plan_part(opened, root, s, rank, into,
                                                                                  strict, state_dicts, stats))
        stats.update(shared)
        return state

    with translate():
        walk = torch.classes.ckpt.NewestFirst(root)
    return _dist_load.load_with_group_shared(root, step, group, attempt, walk,
                                             lambda lines, who: _warn_skipped(root, lines, who))


def _plan_part(reader, root, step, rank, into, strict, state_dicts, stats):
    """This rank's plan for _read_once.load_step: (reader, items, finish),
    every read through `reader`, its StepReader of `step`."""
    with translate():
        info = json.loads(reader.describe())
    manifest = {t["name"]: t for t in info["tensors"]}
    extras = info["extras"]
    if into is None:
        items = [_read_once.Item(n, None, t["shape"], dtype_of(t["dtype"], n), t["raw_bytes"],
                                 t.get("placement") == "replicated") for n, t in manifest.items()]

        def finish(tensors):
            stats["bytes_loaded"] = sum(t.numel() * t.element_size() for t in tensors.values())
            return _rebuild(extras, tensors)
        return reader, items, finish
    tree = _saved_tree(extras, manifest)
    plan = IntoPlan(manifest, step, state_dicts)
    result = plan.fill(tree, into, ())
    plan.check_keys(root, strict)
    if plan.boxes:  # DTensors' boxes: this rank's own, read now
        try:
            with torch.no_grad(), translate():
                reader.read_regions([b[0] for b in plan.boxes], [b[1] for b in plan.boxes],
                                    [b[2] for b in plan.boxes])
        except CheckpointError:
            raise
        except RuntimeError as e:
            raise wrap(e) from None
    items = [_read_once.Item(n, d, d.shape, d.dtype, manifest[n]["raw_bytes"],
                             manifest[n].get("placement") == "replicated" and d.device.type == "cpu")
             for n, d in zip(plan.names, plan.dsts)]

    def finish(tensors):
        for op in plan.ops:  # only now: a failed read leaves every non-tensor value as it was
            op()
        stats["bytes_loaded"] = sum(d.numel() * d.element_size() for d in plan.dsts) + \
            sum(b[2].numel() * b[2].element_size() for b in plan.boxes)
        return result
    return reader, items, finish


def _saved_tree(extras, manifest):
    """The saved structure of a checkpoint from its extras, or for one
    without (written by the C++ API) a flat {tensor name: tensor}."""
    meta = extras.get(EXTRAS_KEY) if isinstance(extras, dict) else None
    if meta is None:
        return {"$dict": [[n, {"$tensor": n}] for n in manifest]}
    _tree.check_format(meta)
    return meta["tree"]


def _multi_rank_error(root, step, world, own):
    shown = ", ".join(repr(n) for n in own[:5]) + (f" and {len(own) - 5} more" if len(own) > 5 else "")
    return ValueError(f"ckpt: step {step} in {root} is a multi-rank checkpoint of {world} ranks: "
                      f"pass rank=r (0 <= r < {world}) for one rank's part, rank=\"all\" for every "
                      "rank's ({rank: state}), or process_group= with a group of "
                      f"{world} ranks to load each rank's part on its rank (it holds tensors of a "
                      f"rank's own, {shown}: only a checkpoint of global tensors, DTensors and "
                      "replicated ones, loads on another number of ranks)")


def _own_tensors(info):
    """Names of the tensors of a rank's own (default or rank-local placement)
    in `describe()` output of a multi-rank checkpoint: what does not reshard."""
    return [t["name"] for t in info["tensors"] if t.get("placement") not in GLOBAL_PLACEMENTS]




def _world(root, step):
    """(step, world_size) of checkpoint `step` (None: the newest whose
    manifest verifies), or (None, None) if there is none to describe."""
    try:
        with translate():
            info = json.loads(torch.ops.ckpt.describe(root, step, None))
    except CheckpointError:
        return None, None
    return info["step"], info.get("world_size", 1)


def _read_part(root, step, rank, stats=None):
    """Reads checkpoint `step` (None: the newest that reads back), rank
    `rank`'s part of it; rank None: all of a single-process checkpoint, or of
    a multi-rank one whose tensors are all global (through rank 0's view,
    where they are whole), else ValueError before anything is read."""
    described = None
    if rank is None:
        described, world = _world(root, step)
        if world is not None and world > 1:
            if step is None:  # each candidate checked as it comes
                return newest_that_reads(root, lambda s: _read_part(root, s, None, stats)[1])
            own = _own_tensors(describe(root, step))
            if own:
                raise _multi_rank_error(root, step, world, own)
            rank = 0
    with torch.no_grad(), translate():
        chosen, names, tensors, extras, skipped = torch.ops.ckpt.read(root, step, rank)
    if rank is None and chosen != described:  # an older one than the newest manifest
        _, world = _world(root, chosen)
        if world is not None and world > 1:  # read as rank None shows it: read it again as above
            return chosen, _read_part(root, chosen, None, stats)[1]
    _warn_skipped(root, skipped)
    if stats is not None:
        stats["bytes_loaded"] = sum(t.numel() * t.element_size() for t in tensors)
    return chosen, _rebuild(json.loads(extras), dict(zip(names, tensors)))


def _load_all_ranks(root, step, stats=None):
    """{rank: state} of every rank of checkpoint `step` (None: the newest
    whose every part reads back)."""
    def read_all(s):
        world = describe(root, s)["world_size"]
        parts, loaded = {}, 0
        for r in range(world):
            part_stats = {}
            parts[r] = _read_part(root, s, r, part_stats)[1]
            loaded += part_stats["bytes_loaded"]
        if stats is not None:
            stats["bytes_loaded"] = loaded
        return parts

    if step is not None and step >= 0:
        return step, read_all(step)
    return newest_that_reads(root, read_all)


def newest_that_reads(root, attempt, bound=None, who=""):
    """(step, attempt(step)) for the newest committed step (at most `bound`,
    if given) for which `attempt` raises no CheckpointError; each newer one
    that raised is skipped with a SkippedCheckpointWarning ("ckpt: {who}skipped
    step N: ..."). CheckpointNotFoundError if none is left."""
    with translate():
        walk = torch.classes.ckpt.NewestFirst(str(root))
    while (s := walk.next()) is not None:
        if bound is not None and s > bound:
            continue
        try:
            result = attempt(s)
        except CheckpointError as e:
            walk.skip(s, e.code or "", str(e))
            continue
        _warn_skipped(root, walk.skipped(), who)
        return s, result
    with translate():
        walk.raise_none_left()


def _rebuild(extras, by_name):
    meta = extras.get(EXTRAS_KEY) if isinstance(extras, dict) else None
    if meta is None:
        return by_name
    return _tree.unflatten(meta, by_name)


def _warn_skipped(root, skipped, who=""):
    for line in skipped:
        warnings.warn(f"ckpt: {who}skipped {line} (in {root}); using an older checkpoint",
                      SkippedCheckpointWarning, stacklevel=3)


def _load_into(root, step, into, strict, rank=None, stats=None):
    """(step, into) after loading checkpoint `step` (None: the newest that
    loads) into `into`: rank `rank`'s part, or with rank None a
    single-process checkpoint or the global tensors of a multi-rank one."""
    state_dicts = {}  # id(stateful object) -> its state_dict(), taken once per load
    if step is not None and step >= 0:
        return step, _load_step_into(root, step, into, strict, state_dicts, rank, stats)
    return newest_that_reads(
        root, lambda s: _load_step_into(root, s, into, strict, state_dicts, rank, stats))


def _load_step_into(root, step, into, strict, state_dicts, rank=None, stats=None):
    info = describe(root, step, rank)
    resharding = rank is None and info.get("world_size", 1) > 1
    if resharding:  # its global tensors, each whole in every rank's view: rank 0's
        rank = 0
        info = describe(root, step, rank)
    manifest = {t["name"]: t for t in info["tensors"]}
    tree = _saved_tree(info["extras"], manifest)
    plan = IntoPlan(manifest, step, state_dicts, info.get("world_size", 1) if resharding else None)
    result = plan.fill(tree, into, ())
    plan.check_keys(root, strict)
    bytes_read = None
    try:
        with torch.no_grad(), translate():
            if plan.boxes:  # DTensors: every tensor through one read_regions, plain ones whole
                names = plan.names + [b[0] for b in plan.boxes]
                offsets = [[0] * d.dim() for d in plan.dsts] + [b[1] for b in plan.boxes]
                dsts = plan.dsts + [b[2] for b in plan.boxes]
                bytes_read = torch.ops.ckpt.read_regions(root, step, names, offsets, dsts, rank)
            else:
                dsts = plan.dsts
                torch.ops.ckpt.read_into(root, step, plan.names, plan.dsts, rank)
    except CheckpointError:
        raise
    except RuntimeError as e:  # not from the library: e.g. a failed copy_
        raise wrap(e) from None
    for op in plan.ops:  # only now: a failed read leaves every non-tensor value as it was
        op()
    if stats is not None:
        stats["bytes_read"] = bytes_read
        stats["bytes_loaded"] = sum(d.numel() * d.element_size() for d in dsts)
    return result
