"""ckpt.load(root, process_group=group): every rank loads its own part of one
multi-rank checkpoint, the same step on every rank.

This runs in the foreground, called by every rank of the group, so it uses
the group's collectives (all_gather_object); the engine's background commit
never does. Every outcome goes through a collective before anything is
raised, so a failure on one rank raises on every rank instead of leaving the
others waiting in the next collective.

The step: each rank proposes the newest step at or below a bound whose part
it can read (without `into`: it reads it, and keeps what it read; with
`into`: it loads it into `into`, and loads again if the ranks settle on an
older step); the bound becomes the smallest proposal, until every rank
proposes the same step.

The part: a checkpoint written by as many ranks as the group has loads each
rank's own part on that rank. One written by another number of ranks (or by
one process) is resharded: every rank reads its global tensors (DTensors'
chunks and replicated tensors), as loading.py does without a rank.

loading.py calls this module and hands it the loads it needs, so this module
imports nothing of the package above errors.py (no import cycle).
"""
from .errors import CheckpointError, error_for, translate

_KINDS = {"ValueError": ValueError, "TypeError": TypeError}


def _failure(error):
    """The gathered form of an exception: ("error", kind, code, message)."""
    if isinstance(error, CheckpointError):
        return ("error", "CheckpointError", error.code or "", str(error))
    kind = type(error).__name__ if type(error) in (ValueError, TypeError) else "CheckpointError"
    return ("error", kind, "", f"{type(error).__name__}: {error}" if kind == "CheckpointError"
            else str(error))


def collective(group, root, fn):
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


def load_with_group(root, step, group, load_part, world_of, newest_that_reads):
    """(step, state): this rank's part of the agreed checkpoint (see the module).

    load_part(s, part): the state a load of step `s` gives for `part` (a rank,
    or None: the global tensors, resharded); world_of(s): how many ranks wrote
    step `s`; newest_that_reads(attempt, bound, who): (step, attempt(step)) for
    the newest step at most `bound` that `attempt` loads (loading.py's)."""
    rank, world = group.rank(), group.size()

    def attempt(s):  # the state this rank reads of step `s`, or `into` loaded with it
        # Its own part if as many ranks wrote `s`, else the global tensors.
        return load_part(s, rank if world_of(s) == world else None)

    if step is not None and int(step) >= 0:
        step = int(step)
        return step, collective(group, root, lambda: (step, attempt(step)))[1]

    def propose():  # (step, (step, state)): the newest this rank can load at most `bound`
        got = kept if kept is not None and kept[0] == bound else newest_that_reads(
            attempt, bound, f"rank {rank} ")
        return got[0], got

    bound, kept = None, None  # kept: (step, state) this rank loaded
    while True:
        steps, kept = collective(group, root, propose)
        bound = min(steps)
        if all(s == bound for s in steps):
            return kept


def load_with_group_shared(root, step, group, attempt, walk, warn):
    """(step, state) as load_with_group, for loads that are collectives
    themselves (_read_once: each replicated tensor read by one rank and sent
    to the others). attempt(s): the state of step `s`, run by every rank
    together, raising alike on every rank (a CheckpointError: `s` does not
    load). walk: this rank's torch.classes.ckpt.NewestFirst; warn(lines,
    who): warns of the steps skipped.

    The step: every rank proposes its newest step at most a bound; the
    smallest proposal is loaded by all; if it fails, every rank skips it and
    the bound drops below it."""
    if step is not None and int(step) >= 0:
        return int(step), attempt(int(step))
    bound, pending = None, None

    def propose():  # (step, None): this rank's newest step at most `bound`
        nonlocal pending
        while pending is None or (bound is not None and pending > bound):
            with translate():
                pending = walk.next()
                if pending is None:
                    walk.raise_none_left()
        return pending, None

    while True:
        steps, _ = collective(group, root, propose)
        chosen = min(steps)
        try:
            state = attempt(chosen)
        except CheckpointError as e:
            walk.skip(chosen, e.code or "", str(e))
            bound = chosen - 1
            continue
        warn(walk.skipped(), f"rank {group.rank()} ")
        return chosen, state
