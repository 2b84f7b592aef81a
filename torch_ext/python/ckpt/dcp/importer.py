"""ckpt.dcp.import_checkpoint: a DCP FileSystemWriter directory -> one ckpt checkpoint.

Nothing is loaded whole: each tensor item of the DCP files (a torch.save
archive at an offset of a .distcp file) is located inside its archive (its
dtype, shape and strides read with torch.load(weights_only=True) under
torch.serialization.skip_data(), which reads no tensor bytes), and handed to
ckpt's engine as a tensor over a read-only mmap of the file. The engine copies
those pages through its bounded staging memory (lazy staging,
`staging_bytes`), writes, hashes and commits them, so memory stays at the
staging size plus page cache the kernel may drop. The metadata is read
without running code (_metadata) after checking that every file is complete
(_dcp_dir), and the committed checkpoint is verified (every record read back
against its XXH3) unless verify=False.
"""
import base64
import copy
import io
import json
import mmap
import os
import struct
import warnings
import zipfile

import torch

from .. import _lib, loading
from ..checkpointer import _compression
from ..errors import translate
from . import _dcp_dir, _layout, _metadata
from .errors import DcpError
from .writer import EXTRAS_KEY, FORMAT, _Save

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature ... name length, extra length


class _Slice(io.RawIOBase):
    """Bytes [offset, offset+length) of a file, as a seekable stream."""

    def __init__(self, f, offset, length):
        self._f, self._start, self._length, self._pos = f, offset, length, 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, pos, whence=0):
        base = {0: 0, 1: self._pos, 2: self._length}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def readinto(self, buf):
        n = max(0, min(len(buf), self._length - self._pos))
        self._f.seek(self._start + self._pos)
        got = self._f.readinto(memoryview(buf)[:n])
        self._pos += got
        return got


def _record_offset(f, start, info):
    """Where the bytes of zip member `info` begin, from the file's start."""
    f.seek(start + info.header_offset)
    sig, name_len, extra_len = _LOCAL_HEADER.unpack(f.read(_LOCAL_HEADER.size))
    if sig != b"PK\x03\x04":
        raise DcpError(f"ckpt.dcp: bad zip local header for {info.filename}")
    return start + info.header_offset + _LOCAL_HEADER.size + name_len + extra_len


def _mapped_tensor(f, mapped, sinfo, where):
    """The tensor of the torch.save archive at `sinfo` of file `f` (mapped
    as `mapped`), as a view of the mapping."""
    piece = _Slice(f, sinfo.offset, sinfo.length)
    try:
        with torch.serialization.skip_data():
            meta = torch.load(piece, weights_only=True, map_location="cpu")
    except Exception as e:  # noqa: BLE001 -- e.g. a safetensors-format DCP item
        raise DcpError(f"ckpt.dcp: {where} is not a torch.save archive (import reads DCP's "
                       f"default TORCH_SAVE format): {type(e).__name__}: {e}") from e
    if not isinstance(meta, torch.Tensor):
        raise DcpError(f"ckpt.dcp: {where} is not a tensor archive")
    piece.seek(0)
    records = [i for i in zipfile.ZipFile(piece).infolist()
               if "/data/" in i.filename and not i.filename.endswith("/")]
    order = [i for i in zipfile.ZipFile(piece).infolist() if i.filename.endswith("/byteorder")]
    if len(records) != 1 or records[0].compress_type != zipfile.ZIP_STORED:
        raise DcpError(f"ckpt.dcp: {where}: expected one uncompressed storage record, found "
                       f"{[(i.filename, i.compress_type) for i in records]}")
    if order:
        piece.seek(0)
        if zipfile.ZipFile(piece).read(order[0]) != b"little":
            raise DcpError(f"ckpt.dcp: {where} was saved big-endian")
    begin = _record_offset(f, sinfo.offset, records[0])
    nbytes = records[0].file_size
    if begin + nbytes > sinfo.offset + sinfo.length:
        raise DcpError(f"ckpt.dcp: {where}: its storage record runs past the item")
    if meta.numel() == 0:
        return torch.empty(meta.shape, dtype=meta.dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "buffer is not writable": it is read only
        flat = torch.frombuffer(mapped, dtype=torch.uint8, count=nbytes, offset=begin)
    return flat.view(meta.dtype).as_strided(meta.shape, meta.stride(), meta.storage_offset())


class _Files:
    """The DCP data files, opened and mapped once each."""

    def __init__(self, path):
        self._path, self._open = path, {}

    def get(self, rel):
        if rel not in self._open:
            f = open(os.path.join(self._path, rel), "rb")
            size = os.fstat(f.fileno()).st_size
            mapped = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else b""
            self._open[rel] = (f, mapped)
        return self._open[rel]

    def close(self):
        for f, mapped in self._open.values():
            f.close()
            if isinstance(mapped, mmap.mmap):
                try:
                    mapped.close()
                except BufferError:  # a tensor still views it; freed with the tensor
                    pass


class _PlanItem:
    """What _layout.assign needs of one stored DCP item (as a WriteItem has it)."""

    def __init__(self, index, md):
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
        self.index = index
        self.tensor_data = None
        if hasattr(md, "chunks"):
            chunk = next((c for c in md.chunks if tuple(c.offsets) == tuple(index.offset or ())),
                         None)
            if chunk is None:
                raise DcpError(f"ckpt.dcp: the metadata stores a chunk of {index.fqn!r} at "
                               f"{tuple(index.offset or ())} that it does not describe")
            self.tensor_data = _TensorData(ChunkStorageMetadata(chunk.offsets, chunk.sizes),
                                           md.size)


class _TensorData:
    def __init__(self, chunk, size):
        self.chunk, self.size = chunk, size


class _Plan:
    def __init__(self, items):
        self.items = items


def import_checkpoint(dcp_dir, root, step, staging_bytes=256 << 20, verify=True,
                      compression=None, **options):
    """Converts the DCP checkpoint in `dcp_dir` (written by FileSystemWriter,
    on any number of ranks) into checkpoint `step` of the ckpt root `root`,
    readable with ckpt.dcp.StorageReader(root) (any world size), listed and
    verified by ckpt-restore. Streams: memory stays near `staging_bytes`.
    Returns the save's statistics. Raises DcpError for an incomplete or
    unsupported DCP directory (naming the file), UnsafeMetadataError for a
    metadata file that is not plain DCP metadata; writes nothing then."""
    _lib.load()
    dcp_dir = os.path.abspath(os.fspath(dcp_dir))
    metadata = _dcp_dir.read_checked_metadata(dcp_dir)
    for index, sinfo in metadata.storage_data.items():
        if getattr(sinfo, "transform_descriptors", None):
            raise DcpError(f"ckpt.dcp: {dcp_dir}: item {index.fqn!r} was written through DCP "
                           f"extensions {list(sinfo.transform_descriptors)}; import reads plain "
                           "items only (load it with dcp.load and save it again)")
    items = [_PlanItem(index, metadata.state_dict_metadata[index.fqn])
             for index in metadata.storage_data]
    places = _layout.assign([_Plan(items)], multi_rank=False)[0]
    files = _Files(dcp_dir)
    opts = {"lazy": True, "staging_bytes": int(staging_bytes), **_compression(compression),
            **options}
    try:
        save = _Save(int(step), multi_rank=False)
        stored = {}
        for item in items:
            sinfo = metadata.storage_data[item.index]
            f, mapped = files.get(sinfo.relative_path)
            place = places[item.index]
            where = f"{dcp_dir}/{sinfo.relative_path} item {item.index.fqn!r}"
            if item.tensor_data is None:
                f.seek(sinfo.offset)
                tensor = torch.frombuffer(bytearray(f.read(sinfo.length)), dtype=torch.uint8) \
                    if sinfo.length else torch.empty(0, dtype=torch.uint8)
                place = _layout.Place(place.name, (0,), (tensor.numel(),), False)
            else:
                tensor = _mapped_tensor(f, mapped, sinfo, where)
                if tuple(tensor.shape) != tuple(item.tensor_data.chunk.sizes):
                    raise DcpError(f"ckpt.dcp: {where} has shape {tuple(tensor.shape)} but the "
                                   f"metadata says {tuple(item.tensor_data.chunk.sizes)}")
            save.add(place, tensor)
            stored[item.index] = place.stored()
        imported = copy.copy(metadata)
        imported.storage_data = stored
        blob = base64.b64encode(_metadata.dump_metadata(imported)).decode("ascii")
        extras = json.dumps({EXTRAS_KEY: {"format": FORMAT, "metadata": blob,
                                          "imported_from": dcp_dir}})
        with translate():
            engine = torch.classes.ckpt.Engine(os.fspath(root), json.dumps(opts))
            try:
                handle = save.start(engine, extras)
                handle.wait()
                stats = json.loads(handle.stats_json())
            finally:
                engine.close(False)
        del save, handle
    finally:
        files.close()
    if verify:
        loading.verify(root, int(step))
    return stats
