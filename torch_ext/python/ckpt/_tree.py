"""The state tree: nested containers <-> (tensor names, tensors, JSON).

`flatten(state)` walks a nested structure and returns the tensors it holds
(each under a readable, unique name such as "model.fc.weight" or
"optim.state.0.exp_avg") and a JSON-able description of everything else, which
is stored in the checkpoint's extras. `unflatten(tree, tensors)` rebuilds the
structure. Types survive exactly:

  tensor            {"$tensor": name}            (each leaf its own tensor; views
                                                  sharing storage come back as
                                                  separate tensors)
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

Anything else is refused with a TypeError naming where it is: nothing is ever
pickled, so loading a checkpoint never runs code.
"""
import collections

import torch

FORMAT = 1
_INT64_MIN = -(2 ** 63)
_INT64_MAX = 2 ** 63 - 1
_SCALAR_KEY_TYPES = (type(None), bool, int, float, str)
# Element types a checkpoint holds (the library's dtypes that this torch has).
SAVABLE_DTYPES = frozenset(
    [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
     torch.bfloat16, torch.float32, torch.float64]
    + [getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)])


class _Flattener:
    def __init__(self):
        self.names = []
        self.tensors = []
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
            if x.is_sparse or x.layout != torch.strided:
                raise TypeError(f"ckpt: cannot save the {x.layout} tensor at {_where(path)}: "
                                "only dense (strided) tensors are saved")
            if x.dtype not in SAVABLE_DTYPES:
                raise TypeError(f"ckpt: cannot save the tensor at {_where(path)}: its dtype {x.dtype} "
                                "is not one a checkpoint holds (bool, uint8, int8..int64, float16, "
                                "bfloat16, float32, float64)")
            name = self.tensor_name(path)
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
        raise TypeError(
            f"ckpt: cannot save a value of type {t.__module__}.{t.__qualname__} at {_where(path)}: "
            "a checkpoint holds tensors, None, bool, int, float, str, list, tuple, dict, "
            "torch.Size, torch.dtype and torch.device; other objects are never pickled "
            "(convert it, e.g. to a dict of those, or leave it out)")

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


def _component(key):
    if isinstance(key, tuple):
        return "(" + ",".join(_component(k) for k in key) + ")"
    return str(key)


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


def flatten(state):
    """Returns (names, tensors, tree): tensors in visiting order, and the JSON tree."""
    f = _Flattener()
    tree = f.encode(state, ())
    return f.names, f.tensors, {"format": FORMAT, "tree": tree}


def unflatten(meta, tensors):
    """Rebuilds the state from the tree `meta` and a mapping name -> tensor."""
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"ckpt: unknown state-tree format {meta.get('format') if isinstance(meta, dict) else meta!r}")
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


def tensor_paths(meta):
    """Yields (path, name) of every tensor leaf of the tree, path as a tuple of keys."""
    yield from _paths(meta["tree"], ())


def _paths(x, path):
    if isinstance(x, list):
        for i, v in enumerate(x):
            yield from _paths(v, path + (i,))
    elif isinstance(x, dict):
        tag = _tag(x)
        v = x[tag]
        if tag == "$tensor":
            yield path, v
        elif tag == "$tuple":
            for i, e in enumerate(v):
                yield from _paths(e, path + (i,))
        elif tag in ("$dict", "$odict"):
            for k, e in v:
                yield from _paths(e, path + (_decode_key(k),))


def lookup(state, path):
    """The value at `path` in `state`, or None if there is none."""
    for k in path:
        try:
            state = state[k]
        except (KeyError, IndexError, TypeError):
            return None
    return state

