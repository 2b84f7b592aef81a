"""ckpt.load(root, process_group=group): every rank loads its own part of one
multi-rank checkpoint, the same step on every rank.

This runs in the foreground, called by every rank of the group, so it uses
the group's collectives (all_gather_object); the engine's background commit
never does. Every outcome goes through a collective before anything is
raised, so a failure on one rank raises on every rank instead of leaving the
others waiting in the next collective.

The step: each rank proposes the newest step at or below a bound whose part
it can read (without `into`: it reads it, and keeps what it read) or verify
(with `into`: it loads only the agreed step); the bound becomes the smallest
proposal, until every rank proposes the same step.
"""
import warnings

import torch

from . import loading
from .errors import CheckpointError, error_for, translate

_KINDS = {"ValueError": ValueError, "TypeError": TypeError}


def _gather(group, outcome):
    import torch.distributed as dist
    out = [None] * group.size()
    dist.all_gather_object(out, outcome, group=group)
    return out


def _failure(error):
    """The gathered form of an exception: ("error", kind, code, message)."""
    if isinstance(error, CheckpointError):
        return ("error", "CheckpointError", error.code or "", str(error))
    kind = type(error).__name__ if type(error) in (ValueError, TypeError) else "CheckpointError"
    return ("error", kind, "", f"{type(error).__name__}: {error}" if kind == "CheckpointError"
            else str(error))


def _raise_failed(root, gathered, world, own=None):
    """Raises, on every rank alike, the error for the ranks whose outcome
    failed (chained to this rank's own exception `own`, if it had one)."""
    failed = [(r, o) for r, o in enumerate(gathered) if o[0] != "ok"]
    if not failed:
        return
    _, (_, kind, code, _) = failed[0]
    message = (f"ckpt: load from {root} on a group of {world} ranks: "
               + "; ".join(f"rank {r}: {o[3]}" for r, o in failed))
    error = _KINDS[kind](message) if kind in _KINDS else error_for(code or None, message)
    raise error from own


def _check_world(root, step, world):
    info = loading.describe(root, step)
    if info.get("world_size", 1) != world:
        raise ValueError(f"ckpt: step {step} in {root} was written by {info.get('world_size', 1)} "
                         f"rank(s), but this group has {world} (loading onto another number of "
                         "ranks is not supported; without a group, ckpt.load(root, rank=r) reads "
                         "any rank's part)")


def _try(root, step, rank, world, read):
    """Checks or reads rank `rank`'s part of `step`: the state read (read), or None."""
    _check_world(root, step, world)
    if read:
        return loading._read_part(root, step, rank)[1]
    loading.verify(root, step, rank)
    return None


def _newest(root, bound, rank, world, read):
    """(step, state or None): the newest step <= bound (None: any) whose part
    of rank `rank` reads back (read) or verifies."""
    with translate():
        walk = torch.classes.ckpt.NewestFirst(root)
    while (s := walk.next()) is not None:
        if bound is not None and s > bound:
            continue
        try:
            state = _try(root, s, rank, world, read)
        except CheckpointError as e:
            walk.skip(s, e.code or "", str(e))
            continue
        for line in walk.skipped():
            warnings.warn(f"ckpt: rank {rank} skipped {line} (in {root}); using an older checkpoint",
                          loading.SkippedCheckpointWarning, stacklevel=4)
        return s, state
    with translate():
        walk.raise_none_left()


def load_with_group(root, step, into, strict, group):
    """(step, state): this rank's part of the agreed checkpoint (see the module)."""
    rank, world = group.rank(), group.size()
    if step is not None and int(step) >= 0:
        step = int(step)
        state = own = None
        try:
            if into is None:
                state = _try(root, step, rank, world, read=True)
            else:
                _check_world(root, step, world)
                state = loading._load_into(root, step, into, strict, rank)[1]
            outcome = ("ok", step)
        except Exception as e:  # noqa: BLE001 -- every rank raises it, below
            outcome, own = _failure(e), e
        _raise_failed(root, _gather(group, outcome), world, own)
        return step, state

    bound, kept = None, None  # kept: (step, state) this rank read
    while True:
        try:
            if kept is not None and kept[0] == bound:
                proposal = kept
            else:
                proposal = _newest(root, bound, rank, world, read=into is None)
            outcome, own = ("ok", proposal[0]), None
        except Exception as e:  # noqa: BLE001 -- every rank raises it, below
            proposal, outcome, own = None, _failure(e), e
        gathered = _gather(group, outcome)
        _raise_failed(root, gathered, world, own)
        steps = [o[1] for o in gathered]
        kept, bound = proposal, min(steps)
        if all(s == bound for s in steps):
            break
    if into is None:
        return kept
    state = own = None
    try:
        state = loading._load_into(root, bound, into, strict, rank)[1]
        outcome = ("ok", bound)
    except Exception as e:  # noqa: BLE001 -- every rank raises it, below
        outcome, own = _failure(e), e
    _raise_failed(root, _gather(group, outcome), world, own)
    return bound, state
