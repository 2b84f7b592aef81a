"""ckpt.load and friends: reading checkpoints back into a nested state."""
import json
import warnings

import torch

from . import _lib, _tree
from .checkpointer import EXTRAS_KEY
from .errors import CheckpointError, CheckpointNotFoundError, translate, wrap

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


def describe(root, step=None):
    """The manifest of checkpoint `step` (default: the newest whose manifest
    verifies) as a dict: step, dir, extras, tensors [{name, dtype, shape, ...}].
    Reads no tensor data."""
    _lib.load()
    with translate():
        return json.loads(torch.ops.ckpt.describe(str(root), None if step is None else int(step)))


def verify(root, step):
    """Reads every record of checkpoint `step` and checks every checksum;
    raises CorruptCheckpointError naming the file and tensor if one fails."""
    _lib.load()
    with translate():
        torch.ops.ckpt.verify(str(root), int(step))


def load(root, step=None, into=None, with_step=False):
    """Reads checkpoint `step` of `root` back into the structure that was saved.

    step: None means the newest checkpoint that reads back completely and
        verifies; a newer one that does not is skipped with a
        SkippedCheckpointWarning naming it and why.
    into: an existing state (e.g. {"model": model.state_dict(), ...}): each
        saved tensor whose place in `into` holds a tensor is copied into that
        tensor in place (any device; dtype and shape must match, else
        ValueError/TypeError); tensors `into` lacks are read into new CPU
        tensors. If a newer checkpoint fails part-way, the tensors may hold
        some of its data until an older one overwrites them; if every
        checkpoint fails their contents are unspecified.
    with_step: return (step, state) instead of state.

    Returns the saved structure with its key types (int keys of optimizer
    state stay int), containers (tuple vs list, OrderedDict) and non-tensor
    leaves exactly as saved; tensors are CPU tensors (or those of `into`). A
    checkpoint written by the C++ API (no saved structure) comes back as a
    dict {tensor name: tensor}.
    """
    _lib.load()
    root = str(root)
    if into is None:
        with torch.no_grad(), translate():
            chosen, names, tensors, extras, skipped = torch.ops.ckpt.read(
                root, None if step is None else int(step))
        _warn_skipped(root, skipped)
        state = _rebuild(json.loads(extras), dict(zip(names, tensors)))
    else:
        chosen, state = _load_into(root, step, into)
    return (chosen, state) if with_step else state


def _rebuild(extras, by_name):
    meta = extras.get(EXTRAS_KEY) if isinstance(extras, dict) else None
    if meta is None:
        return by_name
    return _tree.unflatten(meta, by_name)


def _warn_skipped(root, skipped):
    for line in skipped:
        warnings.warn(f"ckpt: skipped {line} (in {root}); using an older checkpoint",
                      SkippedCheckpointWarning, stacklevel=3)


def _load_into(root, step, into):
    if step is not None and int(step) >= 0:
        return int(step), _load_step_into(root, int(step), into)
    candidates = list_steps(root)
    skipped = []
    for s in reversed(candidates):
        try:
            state = _load_step_into(root, s, into)
        except CheckpointError as e:
            skipped.append(f"step {s}: {e}")
            continue
        _warn_skipped(root, skipped)
        return s, state
    why = "no committed checkpoint" if not candidates else \
        "no checkpoint reads back intact (" + "; ".join(skipped) + ")"
    raise CheckpointNotFoundError(f"ckpt: load from {root}: NOT_FOUND: {why}")


def _load_step_into(root, step, into):
    info = describe(root, step)
    meta = info["extras"].get(EXTRAS_KEY) if isinstance(info["extras"], dict) else None
    manifest = {t["name"]: t for t in info["tensors"]}
    if meta is None:  # no saved structure: `into` is {tensor name: tensor}
        paths = [((n,), n) for n in manifest]
    else:
        paths = list(_tree.tensor_paths(meta))
    names, dsts, by_name = [], [], {}
    for path, name in paths:
        t = manifest[name]
        dst = _tree.lookup(into, path)
        if not isinstance(dst, torch.Tensor):
            dst = torch.empty(t["shape"], dtype=_dtype(t["dtype"], name))
        names.append(name)
        dsts.append(dst)
        by_name[name] = dst
    try:
        with torch.no_grad(), translate():
            torch.ops.ckpt.read_into(root, step, names, dsts)
    except CheckpointError:
        raise
    except RuntimeError as e:  # not from the library: e.g. a failed copy_
        raise wrap(e) from None
    return _rebuild({EXTRAS_KEY: meta} if meta is not None else None, by_name)


def _dtype(name, tensor):
    try:
        return _DTYPES[name]
    except KeyError:
        raise CheckpointError(f"ckpt: tensor {tensor!r} has dtype {name}, which this torch "
                              f"({torch.__version__}) cannot hold") from None
