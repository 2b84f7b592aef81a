"""Which ckpt step a DCP `checkpoint_id` names, and the interfaces this torch has."""
import os
import re

from .. import loading
from .errors import DcpError

_STEP_DIR = re.compile(r"step-(\d+)")


def require_dcp():
    """torch.distributed.checkpoint's StorageWriter/StorageReader, or DcpError
    naming what this torch lacks."""
    import torch
    try:
        from torch.distributed.checkpoint import StorageReader, StorageWriter  # noqa: F401
        from torch.distributed.checkpoint.metadata import Metadata, StorageMeta  # noqa: F401
        from torch.distributed.checkpoint.planner import SavePlan  # noqa: F401
    except ImportError as e:
        raise DcpError(f"ckpt.dcp needs torch.distributed.checkpoint with StorageWriter, "
                       f"StorageReader and StorageMeta (torch >= 2.4); torch {torch.__version__} "
                       f"has not: {e}") from e


def parse_checkpoint_id(checkpoint_id, root):
    """The step `checkpoint_id` names: an int >= 0, a string of digits,
    "step-<n>", or the path root/step-<n>. DcpError otherwise."""
    if isinstance(checkpoint_id, bool):
        raise DcpError(f"ckpt.dcp: checkpoint_id {checkpoint_id!r} is not a step")
    if isinstance(checkpoint_id, int):
        if checkpoint_id < 0:
            raise DcpError(f"ckpt.dcp: checkpoint_id {checkpoint_id} is negative; steps are >= 0")
        return checkpoint_id
    if not isinstance(checkpoint_id, (str, os.PathLike)):
        raise DcpError(f"ckpt.dcp: checkpoint_id must name a step (an int, \"step-<n>\" or "
                       f"{os.path.join(str(root), 'step-<n>')}), got a {type(checkpoint_id).__name__}")
    text = os.fspath(checkpoint_id)
    if text.isdigit():
        return int(text)
    head, tail = os.path.split(text.rstrip(os.sep))
    match = _STEP_DIR.fullmatch(tail)
    if match is None:
        raise DcpError(f"ckpt.dcp: checkpoint_id {text!r} does not name a step: give the step "
                       f"number, \"step-<n>\", or {os.path.join(str(root), 'step-<n>')}")
    if head and os.path.abspath(head) != os.path.abspath(str(root)):
        raise DcpError(f"ckpt.dcp: checkpoint_id {text!r} lies outside the root {str(root)!r} "
                       "of this ckpt storage writer/reader")
    return int(match.group(1))


def next_step(root):
    """One more than the newest committed step of `root` (0 for none)."""
    try:
        steps = loading.list_steps(root)
    except Exception:  # noqa: BLE001 -- no root yet: the engine creates it
        steps = []
    return (max(steps) + 1) if steps else 0
