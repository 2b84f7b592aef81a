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
from . import loading
from .errors import CheckpointError, error_for

_KINDS = {"ValueError": ValueError, "TypeError": TypeError}


def _failure(error):
    """The gathered form of an exception: ("error", kind, code, message)."""
    if isinstance(error, CheckpointError):
        return ("error", "CheckpointError", error.code or "", str(error))
    kind = type(error).__name__ if type(error) in (ValueError, TypeError) else "CheckpointError"
    return ("error", kind, "", f"{type(error).__name__}: {error}" if kind == "CheckpointError"
            else str(error))


def _collective(group, root, fn):
    """Runs fn() -> (shared, value) on this rank, as every rank of `group`
    does; returns every rank's `shared` and this rank's `value`. If fn raised
    on any rank, raises on every rank alike: the class of the first failed
    rank's error (ValueError, TypeError, or the CheckpointError of its code),
    a message naming each failed rank and why, chained to this rank's own
    exception if it had one."""
    own = value = None
    try:
        shared, value = fn()
        outcome = ("ok", shared)
    except Exception as e:  # noqa: BLE001 -- every rank raises it, below
        outcome, own = _failure(e), e
    import torch.distributed as dist
    gathered = [None] * group.size()
    dist.all_gather_object(gathered, outcome, group=group)
    failed = [(r, o) for r, o in enumerate(gathered) if o[0] != "ok"]
    if failed:
        _, (_, kind, code, _) = failed[0]
        message = (f"ckpt: load from {root} on a group of {group.size()} ranks: "
                   + "; ".join(f"rank {r}: {o[3]}" for r, o in failed))
        error = _KINDS[kind](message) if kind in _KINDS else error_for(code or None, message)
        raise error from own
    return [o[1] for o in gathered], value


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


def load_with_group(root, step, into, strict, group):
    """(step, state): this rank's part of the agreed checkpoint (see the module)."""
    rank, world = group.rank(), group.size()

    def load_into(s):
        _check_world(root, s, world)
        return s, loading._load_into(root, s, into, strict, rank)[1]

    if step is not None and int(step) >= 0:
        step = int(step)
        read = (lambda: (step, _try(root, step, rank, world, read=True))) if into is None \
            else (lambda: load_into(step))
        return step, _collective(group, root, read)[1]

    def propose():  # (step, (step, state or None)): the newest this rank can read at most `bound`
        got = kept if kept is not None and kept[0] == bound else loading.newest_that_reads(
            root, lambda s: _try(root, s, rank, world, read=into is None), bound,
            who=f"rank {rank} ")
        return got[0], got

    bound, kept = None, None  # kept: (step, state or None) this rank read or verified
    while True:
        steps, kept = _collective(group, root, propose)
        bound = min(steps)
        if all(s == bound for s in steps):
            break
    if into is None:
        return kept
    return bound, _collective(group, root, lambda: load_into(bound))[1]
