"""A directory written by DCP's own FileSystemWriter: its metadata, read
without running code, and the check that every file it names is there in
full."""
import os

from ._metadata import load_metadata
from .errors import DcpError

METADATA_FILE = ".metadata"


def is_dcp_dir(path):
    return os.path.isdir(path) and (os.path.exists(os.path.join(path, METADATA_FILE)) or any(
        name.endswith(".distcp") for name in os.listdir(path)))


def read_checked_metadata(path):
    """The Metadata of DCP directory `path`, after checking that each data
    file it names exists and holds every byte range it lists. DcpError
    naming the missing file or range; UnsafeMetadataError or
    CorruptCheckpointError for a metadata file that is not plain metadata."""
    meta_path = os.path.join(path, METADATA_FILE)
    if not os.path.exists(meta_path):
        raise DcpError(f"ckpt.dcp: {path} has no {METADATA_FILE}: not a complete DCP checkpoint "
                       "(DCP writes it last, so a save that did not finish has none)")
    with open(meta_path, "rb") as f:
        metadata = load_metadata(f.read(), meta_path)
    storage = metadata.storage_data
    if not isinstance(storage, dict):
        raise DcpError(f"ckpt.dcp: {meta_path} has no storage map (storage_data is "
                       f"{type(storage).__name__}); not written by FileSystemWriter")
    needed = {}  # relative path -> (bytes needed, an item needing them)
    for index, info in storage.items():
        rel = getattr(info, "relative_path", None)
        if not isinstance(rel, str) or os.path.isabs(rel) or ".." in rel.split("/"):
            raise DcpError(f"ckpt.dcp: {meta_path}: item {index.fqn!r} names file {rel!r}, "
                           "which does not lie in the checkpoint directory")
        end = int(info.offset) + int(info.length)
        if end > needed.get(rel, (-1, None))[0]:
            needed[rel] = (end, index.fqn)
    for rel, (end, fqn) in sorted(needed.items()):
        file = os.path.join(path, rel)
        if not os.path.exists(file):
            raise DcpError(f"ckpt.dcp: DCP checkpoint {path} is incomplete: {rel} is missing "
                           f"(it holds {fqn!r})")
        size = os.path.getsize(file)
        if size < end:
            raise DcpError(f"ckpt.dcp: DCP checkpoint {path} is incomplete: {rel} has {size} "
                           f"bytes but its items reach byte {end} ({fqn!r}); truncated")
    for index in storage:
        if index.fqn not in metadata.state_dict_metadata:
            raise DcpError(f"ckpt.dcp: {meta_path} stores {index.fqn!r} but does not describe it")
    return metadata
