"""What ckpt.load(root, into=state) does with one checkpoint, worked out
before anything is read (loading.py runs it): which tensors are read whole
and into what, which DTensor boxes, what is replaced and which
load_state_dict() calls follow once the read succeeded, and which places
only one side has.
"""
import collections
import functools
import operator

import torch

from . import _dtensor, _tree
from .errors import CheckpointError


# Placements every rank's view of a multi-rank checkpoint holds alike: what
# loads onto another number of ranks.
GLOBAL_PLACEMENTS = ("replicated", "sharded")


class IntoPlan:
    """What loading one checkpoint into `into` does, worked out before anything
    is read: the tensors to read whole and where (`names`, `dsts`), the
    DTensors' boxes (`boxes`: (name, offset, local tensor)), the replacements
    and load_state_dict() calls to make once the read succeeded (`ops`, in
    order: inner values first), and the places only one side has.

    saved_world: set when a multi-rank checkpoint of that many ranks is
    loaded onto another number of ranks (or one process): only its global
    tensors may be read then; the others' places are collected (`own`)."""

    def __init__(self, manifest, step, state_dicts, saved_world=None):
        self.manifest = manifest
        self.step = step
        self.saved_world = saved_world
        self.names, self.dsts = [], []
        self.boxes = []
        self.ops = []
        self.missing = []  # places of `into` the checkpoint lacks
        self.unexpected = []  # places of the checkpoint `into` lacks
        self.own = []  # (place, name): tensors of a rank's own, asked for while resharding
        self._state_dicts = state_dicts
        self._planned = {}  # name -> destinations planned for it (aliases: several places)
        self._new = {}  # name -> the new tensor `new` made for it
        self._saved_top = None  # the saved state's top node (what a mismatch message shows)
        self._top_matched = False  # a top-level key of `into` is in the saved state

    def fill(self, node, cur, path, grow=False):
        """Plans loading saved `node` into `cur` (at `path`); returns the value
        the place holds afterwards (`cur` itself, unless it is replaced).
        grow: saved entries `cur` lacks are added rather than left out."""
        if path == () and self._saved_top is None:
            self._saved_top = node
        if isinstance(cur, torch.Tensor):
            dtensor = type(cur) is not torch.Tensor and type(cur) is not torch.nn.Parameter
            if dtensor and not _dtensor.is_dtensor(cur):
                raise TypeError(_tree.subclass_message(cur, path))
            if _is_tag(node, "$tensor"):
                (self._read_box if dtensor else self._read)(node["$tensor"], cur, path)
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
                self._top_matched = self._top_matched or path == ()
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
        """The saved value `node`, with new CPU tensors (read later; an alias
        gets the tensor its name was given before, as without `into`)."""
        for name in _tree.tensor_names(node):
            if name in self._new:
                continue
            t = self.manifest[name]
            self._check_global(name, ())
            dst = torch.empty(t["shape"], dtype=dtype_of(t["dtype"], name))
            self.names.append(name)
            self.dsts.append(dst)
            self._new[name] = dst
        return _tree.decode(node, self._new)

    def _check(self, name, dst, path):
        """TypeError/ValueError unless `dst` (a tensor or a DTensor: its global
        shape) matches tensor `name` in dtype and shape and is dense."""
        t = self.manifest[name]
        dtype = dtype_of(t["dtype"], name)
        if dst.dtype != dtype:
            raise TypeError(f"ckpt: {_tree.where(path)} is {_dtype_name(dst.dtype)} but tensor "
                            f"{name!r} of step {self.step} is {t['dtype']}")
        if list(dst.shape) != list(t["shape"]):
            raise ValueError(f"ckpt: {_tree.where(path)} has shape {list(dst.shape)} but tensor "
                             f"{name!r} of step {self.step} has shape {list(t['shape'])}")
        if dst.layout != torch.strided:
            raise TypeError(f"ckpt: {_tree.where(path)} is a {dst.layout} tensor: only dense "
                            "(strided) tensors are loaded into")
        self._check_global(name, path)

    def _check_global(self, name, path):
        if self.saved_world is not None and self.manifest[name].get("placement") not in GLOBAL_PLACEMENTS:
            self.own.append((path, name))

    def _read(self, name, dst, path):
        self._check(name, dst, path)
        if self._planned_already(name, dst):
            return
        self.names.append(name)
        self.dsts.append(dst)

    def _planned_already(self, name, dst):
        """Whether tensor `name` is read into `dst` already: the checkpoint's
        aliases (tied weights) come to one tensor read once. Into the same
        storage again (a tied model), nothing more is done; into another (an
        untied one), a copy from the first follows the read."""
        planned = self._planned.setdefault(name, [])
        for first in planned:
            if _same_view(first, dst):
                return True
        planned.append(dst)
        if len(planned) == 1 or _dtensor.is_dtensor(dst) or _dtensor.is_dtensor(planned[0]):
            return False  # (DTensors of other layouts: each its own box, read)
        self.ops.insert(0, functools.partial(_copy, dst, planned[0]))
        return True

    def _read_box(self, name, dt, path):
        """Plans filling DTensor `dt`'s local tensor with its box of `name`."""
        _dtensor.check(dt, _tree.where(path))
        self._check(name, dt, path)
        shape, offset = _dtensor.local_box(dt)
        local = _dtensor.local_tensor(dt)
        if list(local.shape) != shape:
            raise ValueError(f"ckpt: {_tree.where(path)} is a DTensor whose local tensor has shape "
                             f"{list(local.shape)}, but its placements "
                             f"{_dtensor.describe_placements(dt)} give this rank {shape}")
        if local.numel() and not self._planned_already(name, dt):
            self.boxes.append((name, offset, local))

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
            held = _top_places(self._saved_top)
            if held and not self._top_matched:
                # e.g. into=model for a checkpoint saved as {"model": model, ...}
                problems[-1] += f" (its state holds {_listing(held)})"
        if strict is True and self.unexpected:
            problems.append(f"the state given as `into` has no place for "
                            f"{_listing(self.unexpected)} of the checkpoint")
        if problems:
            how = "" if strict is True else " (strict=False loads only what both have)"
            problems[-1] += how
        if self.own:
            names = [n for _, n in self.own]
            shown = ", ".join(repr(n) for n in names[:10]) + \
                (f" and {len(names) - 10} more" if len(names) > 10 else "")
            problems.append(
                f"step {self.step} in {root} was written by {self.saved_world} ranks and is loaded "
                f"onto another number of them, but `into` asks for tensors of a rank's own "
                f"(rank-local or default placement), which do not reshard: {shown}; leave them "
                f"out of `into`, or load on a group of {self.saved_world} ranks (or with rank=r)")
        if problems:
            raise ValueError("ckpt: load into: " + "; ".join(problems))


def _top_places(node):
    """The places (1-tuples of keys) at the top of a saved state tree node,
    or [] where it is not a dict."""
    if _is_tag(node, "$dict") or _is_tag(node, "$odict"):
        tag = "$odict" if "$odict" in node else "$dict"
        return [(_tree.decode_key(k),) for k, _ in node[tag]]
    return []


def _local(t):
    return _dtensor.local_tensor(t) if _dtensor.is_dtensor(t) else t


def _same_view(a, b):
    """Whether tensors (or DTensors, by their local tensors) `a` and `b` are
    one view of one storage."""
    if a is b:
        return True
    a, b = _local(a), _local(b)
    return a.device == b.device and a.dtype == b.dtype and a.shape == b.shape and \
        a.stride() == b.stride() and a.numel() > 0 and a.data_ptr() == b.data_ptr()


def _copy(dst, src):
    """Copies an alias's value, read into `src`, into `dst`."""
    dst.copy_(src)


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


def dtype_of(name, tensor):
    try:
        return _tree.DTYPES_BY_NAME[name]
    except KeyError:
        raise CheckpointError(f"ckpt: tensor {tensor!r} has dtype {name}, which this torch "
                              f"({torch.__version__}) cannot hold") from None
