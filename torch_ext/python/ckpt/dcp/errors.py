"""Exceptions of ckpt.dcp."""
from ..errors import CheckpointError


class DcpError(CheckpointError):
    """Something DCP asked of ckpt cannot work: an interface this torch lacks,
    a checkpoint_id that names no step, an incomplete DCP directory, a plan
    ckpt cannot store. The message names the cause."""
