"""The state tree: nested containers <-> (tensor names, tensors, JSON).

`flatten(state)` walks a nested structure and returns the tensors it holds
(each under a readable, unique name such as "model.fc.weight" or
"optim.state.0.exp_avg") and a JSON-able description of everything else, which
is stored in the checkpoint's extras. `unflatten(tree, tensors)` rebuilds the
structure. Types survive exactly:

  tensor            {"$tensor": name}            (each leaf its own tensor, except
                                                  aliases: see below)
  None, bool, str   themselves
  int               itself (a JSON integer), or {"$int": "digits"} beyond 64 bits
  float             {"$float": repr(x)}          (exact, incl. nan, inf, -0.0)
  list              [...]
  tuple             {"$tuple": [...]}
  dict              {"$dict": [[key, value], ...]}   (key order and key types kept:
  OrderedDict       {"$odict": [...], "$meta": ...}   int keys stay int; `_metadata`
                                                      of a state_dict is kept)
  torch.Size        {"$size": [...]}
  torch.dtype       {"$dtype": "float32"}
  torch.device      {"$device": "cuda:0"}
  numpy.ndarray     {"$ndarray": name}           (a tensor of the array's dtype and shape)
  numpy scalar      {"$npscalar": ["float32", "0000c03f"]}   (dtype, little-endian bytes in hex:
                                                  exact, NaN payloads too)

Aliases (tied weights): a tensor that is the same view of the same storage
as one met earlier in the walk (same storage, offset, shape, strides, dtype:
`lm_head.weight` tied to `embed_tokens.weight`) is stored once. Its node names
the first one's tensor, {"$tensor": first}, so a load rebuilds both places
from one tensor (ckpt.load returns them sharing it, as torch.load does), and
the tree records the name it would have had: {"aliases": {name: first}}.
Views that overlap otherwise (a slice, a reshape) are saved as their own
tensors.

An object with state_dict() and load_state_dict() (nn.Module, Optimizer, LR
scheduler, a dataloader or RNG holder: a "stateful" object) is saved as what
its state_dict() returns.

A DTensor is saved as {"$tensor": name} too, its global tensor under `name`:
with a multi-rank checkpointer this rank's local tensor is a chunk of it (or
nothing, where another rank writes the same box; see _dtensor.py), on one
process the local tensor must be the whole tensor. Its mesh and placements
are recorded beside the tree, {"dtensors": {name: {...}}}, for information
(a reader that does not know the member ignores it). Other tensor subclasses
(ShardedTensor, any type(t) other than torch.Tensor, nn.Parameter and
DTensor) and anything else are refused with a TypeError naming where they
are: nothing is ever pickled, so loading a checkpoint never runs code.
"""
import collections
import operator
import sys

import torch

from . import _dtensor

FORMAT = 1
# A tree with numpy values is format 2 (a reader of format 1 only would not
# know their nodes); every other tree stays format 1, readable by any reader.
FORMAT_WITH_NUMPY = 2
_INT64_MIN = -(2 ** 63)
_INT64_MAX = 2 ** 63 - 1
_SCALAR_KEY_TYPES = (type(None), bool, int, float, str)
# Element types a checkpoint holds, by the name the manifest gives them (the
# library's dtypes that this torch has; the names are torch's own).
DTYPES_BY_NAME = {n: getattr(torch, n) for n in (
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
    if hasattr(torch, n)}
SAVABLE_DTYPES = frozenset(DTYPES_BY_NAME.values())
# numpy scalar dtypes kept in the tree (those a numpy array of may be saved).
_NUMPY_SCALAR_DTYPES = frozenset(["bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
                                  "uint32", "uint64", "float16", "float32", "float64",
                                  "complex64", "complex128"])


class _Flattener:
    def __init__(self, multi_rank):
        self.multi_rank = multi_rank
        self.names = []
        self.tensors = []
        self.chunks = {}  # position in `names` -> (global shape, global offset) of a DTensor's chunk
        self.dtensors = {}  # name -> _dtensor.mesh_info
        self.aliases = {}  # name a tensor would have had -> the name it is stored under
        self.numpy = False  # a numpy value was met (the tree is FORMAT_WITH_NUMPY)
        self._stored = {}  # _alias_key of each tensor stored -> its name
        self._used = set()
        self._active = set()  # ids of containers on the current path (cycle check)

    def tensor_name(self, path):
        base = ".".join(_component(p) for p in path) or "_"
        name, n = base, 1
        while name in self._used:
            name = f"{base}~{n}"
            n += 1
        self._used.add(name)
        return name

    def encode(self, x, path):
        t = type(x)
        if isinstance(x, torch.Tensor):
            if t is not torch.Tensor and t is not torch.nn.Parameter:
                if _dtensor.is_dtensor(x):
                    return self._encode_dtensor(x, path)
                raise TypeError(subclass_message(x, path))
            check_savable(x, path)
            name = self.tensor_name(path)
            first = self._alias_of(x, name)
            if first is not None:
                return {"$tensor": first}
            self.names.append(name)
            self.tensors.append(x.detach())
            return {"$tensor": name}
        if x is None or t is bool:
            return x
        if t is str:
            _check_str(x, path)
            return x
        if t is int:
            return x if _INT64_MIN <= x <= _INT64_MAX else {"$int": str(x)}
        if t is float:
            return {"$float": repr(x)}
        if t is torch.Size:
            return {"$size": list(x)}
        if t is torch.dtype:
            return {"$dtype": str(x).replace("torch.", "")}
        if t is torch.device:
            return {"$device": str(x)}
        if t in (list, tuple, dict, collections.OrderedDict):
            if id(x) in self._active:
                raise ValueError(f"ckpt: the state contains a cycle at {_where(path)}")
            self._active.add(id(x))
            try:
                return self._encode_container(x, t, path)
            finally:
                self._active.discard(id(x))
        if _distributed_kind(t) is not None:
            raise TypeError(subclass_message(x, path))
        np = sys.modules.get("numpy")  # (a numpy value means numpy is imported)
        if np is not None and isinstance(x, (np.ndarray, np.generic)):
            return self._encode_numpy(x, path, np)
        if is_stateful(x):
            if id(x) in self._active:
                raise ValueError(f"ckpt: the state contains a cycle at {_where(path)}")
            self._active.add(id(x))
            try:
                return self.encode(x.state_dict(), path)
            finally:
                self._active.discard(id(x))
        raise TypeError(
            f"ckpt: cannot save a value of type {t.__module__}.{t.__qualname__} at {_where(path)}: "
            "a checkpoint holds tensors, numpy arrays and scalars of numbers, None, bool, int, "
            "float, str, list, tuple, dict, torch.Size, torch.dtype, torch.device and objects "
            "with state_dict() and load_state_dict(); other objects are never pickled "
            "(convert it, e.g. to a dict of those, or leave it out)")

    def _encode_numpy(self, x, path, np):
        """A numpy array of numbers: stored as a CPU tensor of its dtype and
        shape, loaded back as an array. A numpy scalar: its dtype and bytes,
        in the tree."""
        scalar = isinstance(x, np.generic)
        array = np.asarray(x, order="C")  # (0-d for a scalar; ascontiguousarray makes that 1-d)
        if array.dtype.kind not in "biufc":
            raise TypeError(f"ckpt: cannot save the numpy {'scalar' if scalar else 'array'} at "
                            f"{_where(path)}: its dtype {array.dtype} is not a number "
                            "(bool, integer, float or complex)")
        if not array.dtype.isnative:
            array = array.astype(array.dtype.newbyteorder("="))
        self.numpy = True
        if scalar:
            if array.dtype.name not in _NUMPY_SCALAR_DTYPES:
                raise TypeError(f"ckpt: cannot save the numpy scalar at {_where(path)}: its dtype "
                                f"{array.dtype} has no torch dtype")
            little_endian = array.astype(array.dtype.newbyteorder("<"))
            return {"$npscalar": [array.dtype.name, little_endian.tobytes().hex()]}
        if not array.flags.writeable:  # (torch.from_numpy warns about those)
            array = array.copy()
        try:
            tensor = torch.from_numpy(array)
        except TypeError:
            raise TypeError(f"ckpt: cannot save the numpy value at {_where(path)}: its dtype "
                            f"{array.dtype} has no torch dtype") from None
        check_savable(tensor, path)
        name = self.tensor_name(path)
        self.names.append(name)
        self.tensors.append(tensor)
        return {"$ndarray": name}

    def _encode_dtensor(self, dt, path):
        _dtensor.check(dt, _where(path))
        local = _dtensor.local_tensor(dt).detach()
        check_savable(local, path)
        shape, offset = _dtensor.local_box(dt)
        name = self.tensor_name(path)
        first = self._alias_of(dt, name, local)
        if first is not None:
            return {"$tensor": first}
        self.dtensors[name] = _dtensor.mesh_info(dt)
        if not self.multi_rank:
            if shape != list(dt.shape):
                raise ValueError(
                    f"ckpt: {_where(path)} is a DTensor of shape {list(dt.shape)} of which this "
                    f"rank holds {shape} at {offset} (mesh {list(dt.device_mesh.shape)}, "
                    f"placements {_dtensor.describe_placements(dt)}), but the checkpointer is "
                    "single-process: open it with the process group (every rank saving its "
                    "piece), or save dt.full_tensor()")
            self.names.append(name)
            self.tensors.append(local)
        elif _dtensor.writes_chunk(dt):
            if dt.numel() == 0:  # nothing to tile: the mesh's first rank saves it whole
                if all(c == 0 for c in dt.device_mesh.get_coordinate()):
                    self._add_chunk(name, torch.empty(dt.shape, dtype=local.dtype),
                                    list(dt.shape), [0] * dt.dim())
            elif local.numel():  # (an uneven shard may leave a rank nothing)
                self._add_chunk(name, local, list(dt.shape), offset)
        return {"$tensor": name}

    def _alias_of(self, x, name, local=None):
        """The name of the tensor stored earlier that `x` aliases (recording
        `name` as its alias), or None after recording `x` as stored under
        `name`. `local`: a DTensor's local tensor, whose storage is compared."""
        key = _alias_key(x, x if local is None else local)
        if key is None:
            return None
        first = self._stored.get(key)
        if first is None:
            self._stored[key] = name
            return None
        self.aliases[name] = first
        return first

    def _add_chunk(self, name, local, global_shape, offset):
        self.chunks[len(self.names)] = (global_shape, offset)
        self.names.append(name)
        self.tensors.append(local)

    def _encode_container(self, x, t, path):
        if t is list:
            return [self.encode(v, path + (i,)) for i, v in enumerate(x)]
        if t is tuple:
            return {"$tuple": [self.encode(v, path + (i,)) for i, v in enumerate(x)]}
        items = [[_encode_key(k, path), self.encode(v, path + (k,))] for k, v in x.items()]
        if t is dict:
            return {"$dict": items}
        out = {"$odict": items}
        meta = getattr(x, "_metadata", None)
        if meta is not None:
            out["$meta"] = self.encode(meta, path + ("_metadata",))
        return out


def _alias_key(x, storage_of):
    """What makes two tensors one: the storage of `storage_of` (and where in
    it), with `x`'s type, shape, strides and dtype (a DTensor's global ones and
    its placements). None for a tensor without elements, which aliases nothing
    (a DTensor of which this rank holds nothing is keyed by the object: tied
    parameters are one object, and every rank must see the same aliases)."""
    placements = tuple(_dtensor.describe_placements(x)) if storage_of is not x else None
    if storage_of.numel() == 0:
        return None if placements is None else ("object", id(x))
    where = (storage_of.device, storage_of.untyped_storage().data_ptr(), storage_of.storage_offset(),
             tuple(storage_of.stride()))
    return where + (tuple(x.shape), x.dtype, placements)


def is_stateful(x):
    """Whether `x` is an object (not a class) with state_dict() and load_state_dict()."""
    return not isinstance(x, type) and callable(getattr(x, "state_dict", None)) and \
        callable(getattr(x, "load_state_dict", None))


def as_step(step):
    """`step` as an int: an int, or anything integral that says so through
    __index__ (numpy and 0-d integer torch scalars); TypeError for a bool, a
    float (1.5 would have been saved as step 1) or anything else."""
    if isinstance(step, bool):
        raise TypeError(f"ckpt: a step is an integer, not the bool {step!r}")
    try:
        return operator.index(step)
    except TypeError:
        raise TypeError(f"ckpt: a step is an integer, not {step!r} ({type(step).__name__})") from None


def check_savable(x, path):
    """TypeError unless tensor `x` is dense and of a dtype a checkpoint holds."""
    if x.is_sparse or x.layout != torch.strided:
        raise TypeError(f"ckpt: cannot save the {x.layout} tensor at {_where(path)}: "
                        "only dense (strided) tensors are saved")
    if x.dtype not in SAVABLE_DTYPES:
        raise TypeError(f"ckpt: cannot save the tensor at {_where(path)}: its dtype {x.dtype} "
                        "is not one a checkpoint holds (bool, uint8..uint64, int8..int64, "
                        "float16, bfloat16, float32, float64, complex64, complex128, float8_*)")


def _distributed_kind(cls):
    """"DTensor" or "ShardedTensor" if `cls` is (derived from) one of
    torch.distributed's, else None. Matched by name in the MRO, so nothing of
    torch.distributed is imported (its location differs between versions:
    torch.distributed.tensor, torch.distributed._tensor, ._shard.sharded_tensor)."""
    for c in getattr(cls, "__mro__", ()):
        if c.__name__ in ("DTensor", "ShardedTensor") and \
                c.__module__.startswith("torch.distributed"):
            return c.__name__
    return None


def subclass_message(x, path):
    """The refusal of a ShardedTensor or other tensor subclass at `path`."""
    t = type(x)
    if _distributed_kind(t) == "ShardedTensor":
        return (f"ckpt: {_where(path)} is a ShardedTensor: it is not saved or loaded as such "
                "(DTensors are); convert it to a DTensor, save each rank's local shard instead "
                "(rank_local= with a multi-rank Checkpointer), or leave it out")
    return (f"ckpt: {_where(path)} is a tensor subclass {t.__module__}.{t.__qualname__}: a "
            "checkpoint holds only torch.Tensor and nn.Parameter (convert it, e.g. with "
            "t.as_subclass(torch.Tensor), or leave it out)")


def _component(key):
    if isinstance(key, tuple):
        return "(" + ",".join(_component(k) for k in key) + ")"
    return str(key)


def where(path):
    """`path` as Python indexing of the state: "state['model']['w']"."""
    return _where(path)


def _where(path):
    return "state" + "".join(f"[{k!r}]" for k in path) if path else "the top level"


def _check_str(s, path):
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"ckpt: the string at {_where(path)} is not valid UTF-8 ({e})") from None


def _encode_key(k, path):
    t = type(k)
    if t in _SCALAR_KEY_TYPES:
        if t is str:
            _check_str(k, path)
        if t is int and not _INT64_MIN <= k <= _INT64_MAX:
            return {"$int": str(k)}
        if t is float:
            return {"$float": repr(k)}
        return k
    if t is tuple:
        return {"$tuple": [_encode_key(v, path) for v in k]}
    raise TypeError(f"ckpt: cannot save the dict key {k!r} (type {t.__qualname__}) at "
                    f"{_where(path)}: keys may be None, bool, int, float, str or tuples of those")


class Flat:
    """A state flattened for a save: `names` and `tensors` (visiting order),
    the JSON tree `meta`, and for DTensor chunks their positions in `names`
    with (global shape, global offset) (`chunks`)."""

    def __init__(self, names, tensors, meta, chunks):
        self.names, self.tensors, self.meta, self.chunks = names, tensors, meta, chunks

    def global_shapes_and_offsets(self):
        """The `global_shapes` and `global_offsets` arguments of the save ops:
        ([], []) without chunks, else one list per tensor ([] if not a chunk)."""
        if not self.chunks:
            return [], []
        empty = ([], [])
        boxes = [self.chunks.get(i, empty) for i in range(len(self.names))]
        return [b[0] for b in boxes], [b[1] for b in boxes]


def flatten_for_save(state, multi_rank):
    """`state` as a Flat. multi_rank: DTensors become chunks of their global
    tensors (this rank's, where it writes one); else each DTensor must be
    whole on this rank and is saved as a plain tensor."""
    f = _Flattener(multi_rank)
    tree = f.encode(state, ())
    meta = {"format": FORMAT_WITH_NUMPY if f.numpy else FORMAT, "tree": tree}
    if f.dtensors:
        meta["dtensors"] = f.dtensors
    if f.aliases:
        meta["aliases"] = f.aliases
    return Flat(f.names, f.tensors, meta, f.chunks)


def flatten(state):
    """Returns (names, tensors, tree): tensors in visiting order, and the JSON
    tree, as a single-process save flattens `state`."""
    flat = flatten_for_save(state, multi_rank=False)
    return flat.names, flat.tensors, flat.meta


def check_format(meta):
    """Raises ValueError unless `meta` is a state tree of a format this package reads."""
    if not isinstance(meta, dict) or meta.get("format") not in (FORMAT, FORMAT_WITH_NUMPY):
        raise ValueError(f"ckpt: unknown state-tree format {meta.get('format') if isinstance(meta, dict) else meta!r}")


def unflatten(meta, tensors):
    """Rebuilds the state from the tree `meta` and a mapping name -> tensor."""
    check_format(meta)
    return _decode(meta["tree"], tensors)


def _decode(x, tensors):
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):  # not written by flatten; accept plain JSON numbers
        return x
    if isinstance(x, list):
        return [_decode(v, tensors) for v in x]
    tag = _tag(x)
    v = x[tag]
    if tag == "$tensor":
        return tensors[v]
    if tag == "$ndarray":
        return tensors[v].cpu().numpy()
    if tag == "$npscalar":
        return _numpy_scalar(v)
    if tag == "$int":
        return int(v)
    if tag == "$float":
        return float(v)
    if tag == "$tuple":
        return tuple(_decode(e, tensors) for e in v)
    if tag == "$dict":
        return {_decode_key(k): _decode(e, tensors) for k, e in v}
    if tag == "$odict":
        out = collections.OrderedDict((_decode_key(k), _decode(e, tensors)) for k, e in v)
        if "$meta" in x:
            out._metadata = _decode(x["$meta"], tensors)
        return out
    if tag == "$size":
        return torch.Size(v)
    if tag == "$dtype":
        return getattr(torch, v)
    if tag == "$device":
        return torch.device(v)
    raise ValueError(f"ckpt: malformed state tree node {x!r}")


def _numpy_scalar(v):
    """The numpy scalar that a "$npscalar" node's [dtype, hex bytes] is."""
    import numpy as np  # (a tree with numpy values is read where numpy is)
    if (not isinstance(v, list) or len(v) != 2 or v[0] not in _NUMPY_SCALAR_DTYPES
            or not isinstance(v[1], str)):
        raise ValueError(f"ckpt: malformed numpy scalar node {v!r}")
    dtype = np.dtype(v[0]).newbyteorder("<")
    data = bytes.fromhex(v[1])
    if len(data) != dtype.itemsize:
        raise ValueError(f"ckpt: malformed numpy scalar node {v!r}")
    return np.frombuffer(data, dtype=dtype).astype(dtype.newbyteorder("="))[0]


def _tag(node):
    """The tag of a tagged node. JSON objects come back with their members
    sorted, so "$odict" is looked up rather than taken as the first member."""
    if isinstance(node, dict):
        if "$odict" in node:
            return "$odict"
        if len(node) == 1:
            return next(iter(node))
    raise ValueError(f"ckpt: malformed state tree node {node!r}")


def _decode_key(k):
    if isinstance(k, dict):
        tag = _tag(k)
        v = k[tag]
        if tag == "$int":
            return int(v)
        if tag == "$float":
            return float(v)
        if tag == "$tuple":
            return tuple(_decode_key(e) for e in v)
        raise ValueError(f"ckpt: malformed state tree key {k!r}")
    return k


def decode(node, tensors):
    """The value of tree node `node` (a subtree of a state tree), its tensors
    taken from the mapping name -> tensor `tensors`."""
    return _decode(node, tensors)


def decode_key(key):
    """The dict key that `key` (as stored in a "$dict" node) stands for."""
    return _decode_key(key)


def tensor_names(node):
    """The names of the tensors in tree node `node`, in visiting order."""
    return [name for _, name in _paths(node, ())]


def _paths(x, path):
    if isinstance(x, list):
        for i, v in enumerate(x):
            yield from _paths(v, path + (i,))
    elif isinstance(x, dict):
        tag = _tag(x)
        v = x[tag]
        if tag in ("$tensor", "$ndarray"):
            yield path, v
        elif tag == "$tuple":
            for i, e in enumerate(v):
                yield from _paths(e, path + (i,))
        elif tag in ("$dict", "$odict"):
            for k, e in v:
                yield from _paths(e, path + (_decode_key(k),))
