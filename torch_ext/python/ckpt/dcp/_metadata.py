"""Reading DCP's `Metadata` without running code from the file.

DCP stores its checkpoint metadata (`.metadata`, and the copy ckpt keeps in a
checkpoint's extras) as a pickle. `pickle.load` would call whatever the file
names; `load_metadata` only builds DCP's own metadata classes, torch dtypes,
layouts and sizes, paths and plain containers, and refuses anything else
with `UnsafeMetadataError` naming the global it met. Nothing in an allowed
class runs beyond its own `__setstate__`/enum lookup.
"""
import io
import pickle

import torch

from ..errors import CorruptCheckpointError

_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_ALLOWED = {
    _METADATA_MODULE: {"Metadata", "TensorStorageMetadata", "TensorProperties",
                       "ChunkStorageMetadata", "BytesStorageMetadata", "MetadataIndex",
                       "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},  # a layout by its name: a dict lookup
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"},
    "collections": {"OrderedDict"},
    "builtins": {"set", "frozenset", "tuple", "list", "dict", "bytes", "bytearray", "slice",
                 "complex", "int", "float", "bool", "str"},
}


class UnsafeMetadataError(CorruptCheckpointError):
    """A DCP metadata pickle names something other than DCP's metadata
    classes and plain values (it would run code if unpickled)."""


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, data, where):
        super().__init__(io.BytesIO(data))
        self._where = where

    def find_class(self, module, name):
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        raise UnsafeMetadataError(
            f"ckpt: {self._where} is not plain DCP metadata: it refers to {module}.{name}, "
            "which loading it would call; refused (only DCP's metadata classes, torch dtypes, "
            "sizes and layouts, paths and builtin containers are allowed)")

    def persistent_load(self, pid):
        raise UnsafeMetadataError(f"ckpt: {self._where} holds a persistent reference; refused")


def load_metadata(data, where):
    """The `Metadata` pickled in `data` (bytes); `where` names it in errors.
    Raises UnsafeMetadataError for a pickle that names anything else, and
    CorruptCheckpointError for one that is garbled or not a Metadata."""
    from torch.distributed.checkpoint.metadata import Metadata
    try:
        metadata = _RestrictedUnpickler(data, where).load()
    except UnsafeMetadataError:
        raise
    except Exception as e:  # noqa: BLE001 -- a truncated or garbled pickle
        raise CorruptCheckpointError(f"ckpt: {where} is not a readable DCP metadata pickle: "
                              f"{type(e).__name__}: {e}") from e
    if not isinstance(metadata, Metadata):
        raise CorruptCheckpointError(f"ckpt: {where} holds a {type(metadata).__name__}, not DCP Metadata")
    return metadata


def dump_metadata(metadata):
    return pickle.dumps(metadata, protocol=pickle.HIGHEST_PROTOCOL)
