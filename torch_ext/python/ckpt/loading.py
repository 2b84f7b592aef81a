"""ckpt.load and friends: reading checkpoints back into a nested state."""
# (Over 400 lines: load, load(into=), describe, verify and list_steps share
# the reader calls and the newest-first walk; the multi-rank agreement is in
# _dist_load.py.)

import collections
import functools
import json
import operator
import warnings

import torch

from . import _distributed, _lib, _tree
from .checkpointer import EXTRAS_KEY
from .errors import CheckpointError, translate, wrap

_DTYPES = {"bool": torch.bool, "uint8": torch.uint8, "int8": torch.int8, "int16": torch.int16,
           "int32": torch.int32, "int64": torch.int64, "float16": torch.float16,
           "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}
_DTYPES.update({n: getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)})


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
        return json.loads(torch.ops.ckpt.describe(str(root), None if step is None else int(step),
                                                  _rank(rank)))


def verify(root, step, rank=None):
    """Reads every record of checkpoint `step` (rank r's part only, with
    rank=r) and checks every checksum; raises CorruptCheckpointError naming
    the file and tensor if one fails."""
    _lib.load()
    with translate():
        torch.ops.ckpt.verify(str(root), int(step), _rank(rank))


def _rank(rank):
    if rank is None:
        return None
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"ckpt: rank must be None, a rank >= 0 or \"all\", got {rank!r}")
    return int(rank)


def load(root, step=None, into=None, with_step=False, strict=None, process_group=None, rank=None):
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
        successful read).
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
    process_group: load this rank's part of a multi-rank checkpoint on every
        rank of the group (a collective: every rank must call it). The step is
        the same on every rank: the newest one every rank can read its part
        of (or `step`); an error on any rank is raised on every rank.
    rank: without a group, which part of a multi-rank checkpoint to load: a
        rank r (its own tensors and the replicated ones, as that rank saved
        them), or "all" ({rank: state} for every rank; no `into`). A
        multi-rank checkpoint with neither raises ValueError.

    Without `into`, returns the saved structure with its key types (int keys
    of optimizer state stay int), containers (tuple vs list, OrderedDict) and
    non-tensor leaves exactly as saved; tensors are new CPU tensors; stateful
    objects come back as the state_dict they were saved as. A checkpoint
    written by the C++ API (no saved structure) comes back as a dict
    {tensor name: tensor}.
    """
    _lib.load()
    root = str(root)
    if strict is not None and type(strict) is not bool:
        raise ValueError(f"ckpt: strict must be None, True or False, got {strict!r}")
    if process_group is not None:
        if rank is not None:
            raise ValueError("ckpt: load takes process_group or rank, not both (with a group, each "
                             "rank loads its own part)")
        from . import _dist_load
        chosen, state = _dist_load.load_with_group(root, step, into, strict,
                                                   _distributed.check_group(process_group))
    elif isinstance(rank, str) and rank == "all":
        if into is not None:
            raise ValueError('ckpt: rank="all" returns {rank: state}; it does not load into a state '
                             "(load each rank's part with rank=r)")
        chosen, state = _load_all_ranks(root, step)
    elif into is None:
        chosen, state = _read_part(root, step, _rank(rank))
    else:
        chosen, state = _load_into(root, step, into, strict, _rank(rank))
    return (chosen, state) if with_step else state


def _multi_rank_error(root, step, world):
    return ValueError(f"ckpt: step {step} in {root} is a multi-rank checkpoint of {world} ranks: "
                      f"pass rank=r (0 <= r < {world}) for one rank's part, rank=\"all\" for every "
                      "rank's ({rank: state}), or process_group= to load each rank's part on its "
                      "rank")


def _world(root, step):
    """(step, world_size) of checkpoint `step` (None: the newest whose
    manifest verifies), or (None, None) if there is none to describe."""
    try:
        with translate():
            info = json.loads(torch.ops.ckpt.describe(root, step, None))
    except CheckpointError:
        return None, None
    return info["step"], info.get("world_size", 1)


def _read_part(root, step, rank):
    """Reads checkpoint `step` (None: the newest that reads back), rank
    `rank`'s part of it (None: all of a single-process checkpoint)."""
    step = None if step is None else int(step)
    described = None
    if rank is None:  # a multi-rank checkpoint needs a rank: checked before anything is read
        described, world = _world(root, step)
        if world is not None and world > 1:
            raise _multi_rank_error(root, described, world)
    with torch.no_grad(), translate():
        chosen, names, tensors, extras, skipped = torch.ops.ckpt.read(root, step, rank)
    if rank is None and chosen != described:  # an older one than the newest manifest
        _, world = _world(root, chosen)
        if world is not None and world > 1:
            raise _multi_rank_error(root, chosen, world)
    _warn_skipped(root, skipped)
    return chosen, _rebuild(json.loads(extras), dict(zip(names, tensors)))


def _load_all_ranks(root, step):
    """{rank: state} of every rank of checkpoint `step` (None: the newest
    whose every part reads back)."""
    def read_all(s):
        world = describe(root, s)["world_size"]
        return {r: _read_part(root, s, r)[1] for r in range(world)}

    if step is not None and int(step) >= 0:
        return int(step), read_all(int(step))
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


def _load_into(root, step, into, strict, rank=None):
    state_dicts = {}  # id(stateful object) -> its state_dict(), taken once per load
    if step is not None and int(step) >= 0:
        return int(step), _load_step_into(root, int(step), into, strict, state_dicts, rank)
    return newest_that_reads(root, lambda s: _load_step_into(root, s, into, strict, state_dicts, rank))


def _load_step_into(root, step, into, strict, state_dicts, rank=None):
    info = describe(root, step, rank)
    if rank is None and info.get("world_size", 1) > 1:
        raise _multi_rank_error(root, step, info["world_size"])
    meta = info["extras"].get(EXTRAS_KEY) if isinstance(info["extras"], dict) else None
    manifest = {t["name"]: t for t in info["tensors"]}
    if meta is None:  # no saved structure: a flat {tensor name: tensor}
        tree = {"$dict": [[n, {"$tensor": n}] for n in manifest]}
    else:
        _tree.check_format(meta)
        tree = meta["tree"]
    plan = _IntoPlan(manifest, step, state_dicts)
    result = plan.fill(tree, into, ())
    plan.check_keys(root, strict)
    try:
        with torch.no_grad(), translate():
            torch.ops.ckpt.read_into(root, step, plan.names, plan.dsts, rank)
    except CheckpointError:
        raise
    except RuntimeError as e:  # not from the library: e.g. a failed copy_
        raise wrap(e) from None
    for op in plan.ops:  # only now: a failed read leaves every non-tensor value as it was
        op()
    return result


class _IntoPlan:
    """What loading one checkpoint into `into` does, worked out before anything
    is read: the tensors to read and where (`names`, `dsts`), the replacements
    and load_state_dict() calls to make once the read succeeded (`ops`, in
    order: inner values first), and the places only one side has."""

    def __init__(self, manifest, step, state_dicts):
        self.manifest = manifest
        self.step = step
        self.names, self.dsts = [], []
        self.ops = []
        self.missing = []  # places of `into` the checkpoint lacks
        self.unexpected = []  # places of the checkpoint `into` lacks
        self._state_dicts = state_dicts

    def fill(self, node, cur, path, grow=False):
        """Plans loading saved `node` into `cur` (at `path`); returns the value
        the place holds afterwards (`cur` itself, unless it is replaced).
        grow: saved entries `cur` lacks are added rather than left out."""
        if isinstance(cur, torch.Tensor):
            if type(cur) is not torch.Tensor and type(cur) is not torch.nn.Parameter:
                raise TypeError(_tree.subclass_message(cur, path))
            if _is_tag(node, "$tensor"):
                self._read(node["$tensor"], cur, path)
                return cur
            return self.new(node)
        if _tree.is_stateful(cur):
            sd = self._state_dict(cur, path)
            loaded = self.fill(node, sd, path, grow=not isinstance(cur, torch.nn.Module))
            self.ops.append(lambda: cur.load_state_dict(loaded))
            return cur
        if isinstance(cur, dict) and (_is_tag(node, "$dict") or _is_tag(node, "$odict")):
            return self._fill_dict(node, cur, path, grow)
        if isinstance(cur, (list, tuple)) and (isinstance(node, list) or _is_tag(node, "$tuple")) \
                and _holds_tensors(cur, set()):
            return self._fill_sequence(node, cur, path, grow)
        return self.new(node)  # a leaf: the saved value replaces it

    def _fill_dict(self, node, cur, path, grow):
        tag = "$odict" if "$odict" in node else "$dict"
        saved = {}
        for k, e in node[tag]:
            saved[_tree.decode_key(k)] = e
        for k in list(cur.keys()):
            if k in saved:
                value = self.fill(saved.pop(k), cur[k], path + (k,), grow)
                if value is not cur[k]:
                    self.ops.append(functools.partial(operator.setitem, cur, k, value))
            elif _has_content(cur[k], set()):
                self.missing.append(path + (k,))
        for k, e in saved.items():  # only in the checkpoint
            if grow:
                self.ops.append(functools.partial(operator.setitem, cur, k, self.new(e)))
            elif _node_has_content(e):
                self.unexpected.append(path + (k,))
        if "$meta" in node and isinstance(cur, collections.OrderedDict):
            self.ops.append(functools.partial(setattr, cur, "_metadata", self.new(node["$meta"])))
        return cur

    def _fill_sequence(self, node, cur, path, grow):
        saved = node if isinstance(node, list) else node["$tuple"]
        out = cur if isinstance(cur, list) else list(cur)
        common = min(len(saved), len(cur))
        for i in range(common):
            value = self.fill(saved[i], cur[i], path + (i,), grow)
            if value is cur[i]:
                continue
            if out is cur:
                self.ops.append(functools.partial(operator.setitem, cur, i, value))
            else:
                out[i] = value
        self.missing.extend(path + (i,) for i in range(common, len(cur)))
        for i in range(common, len(saved)):
            if grow:
                value = self.new(saved[i])
                if out is cur:
                    self.ops.append(functools.partial(cur.append, value))
                else:
                    out.append(value)
            elif _node_has_content(saved[i]):
                self.unexpected.append(path + (i,))
        return cur if out is cur else tuple(out)  # a tuple: rebuilt, replaced in its parent

    def new(self, node):
        """The saved value `node`, with new CPU tensors (read later)."""
        tensors = {}
        for name in _tree.tensor_names(node):
            t = self.manifest[name]
            dst = torch.empty(t["shape"], dtype=_dtype(t["dtype"], name))
            self.names.append(name)
            self.dsts.append(dst)
            tensors[name] = dst
        return _tree.decode(node, tensors)

    def _read(self, name, dst, path):
        t = self.manifest[name]
        dtype = _dtype(t["dtype"], name)
        if dst.dtype != dtype:
            raise TypeError(f"ckpt: {_tree.where(path)} is {_dtype_name(dst.dtype)} but tensor "
                            f"{name!r} of step {self.step} is {t['dtype']}")
        if list(dst.shape) != list(t["shape"]):
            raise ValueError(f"ckpt: {_tree.where(path)} has shape {list(dst.shape)} but tensor "
                             f"{name!r} of step {self.step} has shape {list(t['shape'])}")
        if dst.layout != torch.strided:
            raise TypeError(f"ckpt: {_tree.where(path)} is a {dst.layout} tensor: only dense "
                            "(strided) tensors are loaded into")
        self.names.append(name)
        self.dsts.append(dst)

    def _state_dict(self, obj, path):
        entry = self._state_dicts.get(id(obj))
        if entry is None:
            sd = obj.state_dict()
            self._state_dicts[id(obj)] = entry = (obj, sd)  # (obj keeps the id taken)
        return entry[1]

    def check_keys(self, root, strict):
        """Raises ValueError for places one side lacks, as `strict` says."""
        problems = []
        if strict is not False and self.missing:
            problems.append(f"checkpoint step {self.step} in {root} has nothing for "
                            f"{_listing(self.missing)}")
        if strict is True and self.unexpected:
            problems.append(f"the state given as `into` has no place for "
                            f"{_listing(self.unexpected)} of the checkpoint")
        if problems:
            how = "" if strict is True else " (strict=False loads only what both have)"
            raise ValueError("ckpt: load into: " + "; ".join(problems) + how)


def _listing(paths, limit=10):
    shown = ", ".join(_tree.where(p) for p in paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def _is_tag(node, tag):
    return isinstance(node, dict) and tag in node and (tag == "$odict" or len(node) == 1)


def _holds_tensors(x, seen):
    """Whether `x` holds a tensor or a stateful object (lists, tuples, dicts walked)."""
    if isinstance(x, torch.Tensor) or _tree.is_stateful(x):
        return True
    if isinstance(x, (list, tuple, dict)):
        if id(x) in seen:
            return False
        seen.add(id(x))
        return any(_holds_tensors(v, seen) for v in (x.values() if isinstance(x, dict) else x))
    return False


def _has_content(x, seen):
    """Whether place `x` of `into` asks for anything: an empty dict does not."""
    if isinstance(x, dict):
        if id(x) in seen:
            return False
        seen.add(id(x))
        return any(_has_content(v, seen) for v in x.values())
    return True


def _node_has_content(node):
    if _is_tag(node, "$dict") or _is_tag(node, "$odict"):
        tag = "$odict" if "$odict" in node else "$dict"
        return any(_node_has_content(e) for _, e in node[tag])
    return True


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def _dtype(name, tensor):
    try:
        return _DTYPES[name]
    except KeyError:
        raise CheckpointError(f"ckpt: tensor {tensor!r} has dtype {name}, which this torch "
                              f"({torch.__version__}) cannot hold") from None
