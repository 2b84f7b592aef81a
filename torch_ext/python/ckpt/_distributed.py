"""Multi-rank checkpoints on torch.distributed: which group a Checkpointer
joins, the key prefix its ranks coordinate under, and tensor placements.

The ranks coordinate through the c10d store of their process group (the
engine does, from its background thread; see docs/distributed.md). This
module only decides what the engine is given.
"""
import collections
import hashlib
import math
import numbers
import os
import threading

# Placement codes of torch.ops.ckpt.save_async (ckpt::TensorPlacement).
DEFAULT, REPLICATED, RANK_LOCAL, SHARDED = 0, 1, 2, 3

_openings = collections.Counter()  # abspath(root) -> multi-rank checkpointers opened on it here
_openings_lock = threading.Lock()


def _dist():
    """torch.distributed if this torch has it (some builds lack it), else None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() else None


def resolve_group(process_group):
    """The process group a Checkpointer joins, or None for a single-process one.

    None: the default group if torch.distributed is initialized and has more
    than one rank. False: single-process even then (each rank its own root).
    A ProcessGroup: that group (single-process if it has one rank).
    """
    if process_group is False:
        return None
    dist = _dist()
    if process_group is None:
        if dist is None or not dist.is_initialized():
            return None
        process_group = dist.group.WORLD
    elif dist is None or not isinstance(process_group, dist.ProcessGroup):
        raise TypeError(f"ckpt: process_group must be a torch.distributed ProcessGroup, None or "
                        f"False, got {process_group!r} (a {type(process_group).__name__})")
    return process_group if process_group.size() > 1 else None


def any_rank(flag, process_group):
    """True on every rank of `process_group` if `flag` is True on any (a
    collective: an all_reduce of one integer, on the device the group's
    backend reduces on)."""
    import torch
    dist = _dist()
    backend = str(dist.get_backend(process_group))
    device = "cpu"
    if "gloo" not in backend and "nccl" in backend:
        device = torch.device("cuda", torch.cuda.current_device())
    value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=process_group)
    return bool(value.item())


def check_group(process_group):
    """`process_group` given to load(): a ProcessGroup, else TypeError."""
    dist = _dist()
    if dist is None or not isinstance(process_group, dist.ProcessGroup):
        raise TypeError(f"ckpt: process_group must be a torch.distributed ProcessGroup, got "
                        f"{process_group!r} (a {type(process_group).__name__})")
    return process_group


def next_key_prefix(root):
    """The store namespace of the next multi-rank Checkpointer on `root`:
    "ckpt/<sha1 of its absolute path, 16 hex digits>/<how many this process
    opened on it before>". The same on every rank as long as every rank sees
    `root` under the same absolute path and opens its checkpointers in the
    same order."""
    path = os.path.abspath(os.fspath(root))
    with _openings_lock:
        n = _openings[path]
        _openings[path] += 1
    return f"ckpt/{hashlib.sha1(path.encode('utf-8', 'surrogateescape')).hexdigest()[:16]}/{n}"


def commit_timeout(value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0 or \
            math.isnan(value):
        raise ValueError(f"ckpt: commit_timeout_s must be a positive number of seconds, got {value!r}")
    return float(value)


def _has_prefix(name, prefix):
    if name == prefix:
        return True
    if prefix.endswith("."):
        return name.startswith(prefix)
    # "model" selects "model.fc.weight" (and "model~1", a duplicate's name), not "model2.w".
    return name.startswith(prefix + ".") or name.startswith(prefix + "~")


def _selector(spec, what):
    """A predicate over tensor names for `replicated=` / `rank_local=`."""
    if spec is None or spec is False:
        return None
    if spec is True:
        return lambda name: True
    if callable(spec):
        return lambda name: bool(spec(name))
    if isinstance(spec, (str, os.PathLike)):
        spec = [spec]
    try:
        prefixes = list(spec)
    except TypeError:
        raise TypeError(f"ckpt: {what} must be None, True, an iterable of tensor-name prefixes or a "
                        f"callable(name) -> bool, got {spec!r}") from None
    for p in prefixes:
        if not isinstance(p, str) or not p:
            raise TypeError(f"ckpt: {what} holds {p!r}; tensor-name prefixes are non-empty strings "
                            "such as \"model\" or \"optim.state\"")
    prefixes = tuple(prefixes)
    return lambda name: any(_has_prefix(name, p) for p in prefixes)


class Placements:
    """Which tensors of a save are replicated and which rank-local.

    replicated / rank_local: None (none), True (every tensor), an iterable of
    tensor-name prefixes (a prefix selects the name itself and every name
    below it: "model" selects "model.fc.weight", not "model2.w"), or a
    callable taking a tensor name and returning a bool.
    """

    def __init__(self, replicated, rank_local):
        if replicated is True and rank_local is True:
            raise ValueError("ckpt: replicated=True and rank_local=True: a tensor is either "
                             "replicated or rank-local")
        self._replicated = _selector(replicated, "replicated")
        self._rank_local = _selector(rank_local, "rank_local")

    def of(self, names, sharded=()):
        """One placement code per name ([] when every tensor is default);
        ValueError naming a tensor selected by both. `sharded`: positions in
        `names` of DTensor chunks, which are SHARDED whatever the selectors
        say."""
        if self._replicated is None and self._rank_local is None and not sharded:
            return []
        out = []
        for i, name in enumerate(names):
            if i in sharded:
                out.append(SHARDED)
                continue
            rep = self._replicated is not None and self._replicated(name)
            loc = self._rank_local is not None and self._rank_local(name)
            if rep and loc:
                raise ValueError(f"ckpt: tensor {name!r} is selected both as replicated and as "
                                 "rank-local; it can be only one")
            out.append(REPLICATED if rep else RANK_LOCAL if loc else DEFAULT)
        return out
