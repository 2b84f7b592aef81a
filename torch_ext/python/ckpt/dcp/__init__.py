"""ckpt under torch.distributed.checkpoint (DCP): a storage layer and an importer.

    import torch.distributed.checkpoint as dcp
    import ckpt.dcp

    dcp.save(state, storage_writer=ckpt.dcp.StorageWriter("/ckpt/run1"), checkpoint_id=step)
    dcp.load(state, storage_reader=ckpt.dcp.StorageReader("/ckpt/run1"))   # newest step
    ckpt.dcp.import_checkpoint("/old/dcp/step-1000", "/ckpt/run1", step=1000)
    dcp.load(state, storage_reader=ckpt.dcp.StorageReader("/old/dcp/step-1000"))  # in place

See docs/integrations.md, "torch.distributed.checkpoint".
"""
from ._metadata import UnsafeMetadataError, load_metadata
from .errors import DcpError
from .importer import import_checkpoint
from .reader import StorageReader
from .writer import StorageWriter
from ._engines import close_all

__all__ = ["StorageWriter", "StorageReader", "import_checkpoint", "DcpError",
           "UnsafeMetadataError", "load_metadata", "close_all"]
