"""ckpt.dcp.StorageReader: torch.distributed.checkpoint loads from a ckpt root
(or, in place, from a directory DCP's FileSystemWriter wrote).

    dcp.load(state, storage_reader=ckpt.dcp.StorageReader("/ckpt/run1"))

From a ckpt root: DCP's metadata comes from the checkpoint's extras (written
by ckpt.dcp.StorageWriter or import_checkpoint), unpickled by _metadata's
restricted unpickler; every box DCP's planner asks for is read with ckpt's
region reader (one call per load, every record checked against its XXH3),
whatever the world size and placements that saved it.
From a DCP directory: DCP's FileSystemReader does the reading (tensor items
with torch.load(weights_only=True)); the metadata is read by the restricted
unpickler, after checking that every file it names is complete.
"""
import base64
import io
import os

import torch

from .. import _lib, loading
from ..errors import translate
from . import _dcp_dir, _metadata, _steps
from .errors import DcpError
from .writer import EXTRAS_KEY, FORMAT

from torch.distributed.checkpoint import FileSystemReader as _FileSystemReader  # noqa: E402
from torch.distributed.checkpoint import StorageReader as _DcpStorageReader  # noqa: E402
from torch.distributed.checkpoint.metadata import StorageMeta  # noqa: E402
from torch.distributed.checkpoint.planner import LoadItemType  # noqa: E402


def metadata_of_step(root, step):
    """DCP's Metadata stored in checkpoint `step` of `root`."""
    extras = loading.describe(root, step).get("extras") or {}
    entry = extras.get(EXTRAS_KEY)
    if not isinstance(entry, dict) or "metadata" not in entry:
        raise DcpError(f"ckpt.dcp: step {step} in {root} was not written through ckpt.dcp (its "
                       "extras hold no DCP metadata); read it with ckpt.load")
    if entry.get("format") != FORMAT:
        raise DcpError(f"ckpt.dcp: step {step} in {root} has DCP metadata of format "
                       f"{entry.get('format')!r}; this ckpt reads format {FORMAT}")
    blob = base64.b64decode(entry["metadata"], validate=True)
    return _metadata.load_metadata(blob, f"the DCP metadata of step {step} in {root}")


def newest_dcp_step(root):
    """The newest step of `root` written through ckpt.dcp."""
    steps = loading.list_steps(root)
    for step in reversed(steps):
        extras = loading.describe(root, step).get("extras") or {}
        if EXTRAS_KEY in extras:
            return step
    raise DcpError(f"ckpt.dcp: {root} holds no checkpoint written through ckpt.dcp "
                   f"(steps: {steps or 'none'})")


class StorageReader(_DcpStorageReader):
    """A DCP StorageReader over a ckpt root (step=None: the newest written
    through ckpt.dcp; checkpoint_id of dcp.load names a step as for the
    writer), or over a DCP FileSystemWriter directory, read in place."""

    def __init__(self, root, step=None):
        super().__init__()
        _lib.load()
        self.root = os.path.abspath(os.fspath(root))
        self.step = None if step is None else _steps.parse_checkpoint_id(step, self.root)
        self._plain = None  # a FileSystemReader, when root is a DCP directory
        self._chosen = None  # the step being loaded
        self._storage = None
        self._dtypes = {}

    @property
    def checkpoint_id(self):
        return self.root if self.step is None else os.path.join(self.root, f"step-{self.step:014d}")

    def reset(self, checkpoint_id=None):
        self._chosen = self._storage = None
        if checkpoint_id is None:
            return
        path = os.fspath(checkpoint_id) if isinstance(checkpoint_id, (str, os.PathLike)) else None
        if path and os.path.isabs(path) and _dcp_dir.is_dcp_dir(path):
            self.root, self.step = os.path.abspath(path), None
            return
        self.step = _steps.parse_checkpoint_id(checkpoint_id, self.root)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return isinstance(checkpoint_id, (str, os.PathLike)) and \
            os.path.isdir(os.fspath(checkpoint_id))

    def read_metadata(self):
        if _dcp_dir.is_dcp_dir(self.root):
            metadata = _dcp_dir.read_checked_metadata(self.root)
            self._plain = _FileSystemReader(self.root)
        else:
            self._plain = None
            self._chosen = self.step if self.step is not None else newest_dcp_step(self.root)
            metadata = metadata_of_step(self.root, self._chosen)
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        return metadata

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        if self._plain is not None:
            self._plain.set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._storage = metadata.storage_data
        self._dtypes = {fqn: md.properties.dtype for fqn, md in metadata.state_dict_metadata.items()
                        if hasattr(md, "properties")}

    def prepare_local_plan(self, plan):
        plan.storage_data = self._chosen
        return plan

    def prepare_global_plan(self, plans):
        chosen = {p.storage_data for p in plans}
        if len(chosen) > 1:
            raise DcpError(f"ckpt.dcp: the ranks chose different steps of {self.root} "
                           f"({sorted(chosen)}): a save committed while they chose; pass "
                           "checkpoint_id= (or step=) to load the same one")
        return plans

    def read_data(self, plan, planner):
        if self._plain is not None:
            return self._plain.read_data(plan, planner)
        names, offsets, buffers, targets = [], [], [], []
        blobs = []
        for req in plan.items:
            name, base, shape = self._storage[req.storage_index]
            if req.type == LoadItemType.BYTE_IO:
                buf = torch.empty(shape, dtype=torch.uint8)
                blobs.append((req, buf))
                names.append(name)
                offsets.append([0])
                buffers.append(buf)
                continue
            target = planner.resolve_tensor(req).detach()
            box = [b + o for b, o in zip(base, req.storage_offsets)]
            buf = target
            stored = self._dtypes[req.storage_index.fqn]
            if target.dtype != stored:  # DCP converts on load; so does this
                buf = torch.empty(tuple(req.lengths), dtype=stored)
            names.append(name)
            offsets.append(box)
            buffers.append(buf)
            targets.append((req, target, buf))
        with translate():
            torch.ops.ckpt.read_regions(self.root, int(self._chosen), names, offsets, buffers, None)
        for req, buf in blobs:
            planner.load_bytes(req, io.BytesIO(buf.numpy().tobytes()))
        for req, target, buf in targets:
            if buf is not target:
                target.copy_(buf)
            planner.commit_tensor(req, target)
        future = torch.futures.Future()
        future.set_result(None)
        return future
