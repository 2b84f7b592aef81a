"""ckpt: asynchronous, verified checkpoints of PyTorch training state.

    import ckpt
    with ckpt.Checkpointer("/ckpt/run1", delta="exact") as cp:
        resp = cp.save_async(step, {"model": model.state_dict(),
                                    "optim": optimizer.state_dict(), "step": step})
        ...
    state = ckpt.load("/ckpt/run1")          # newest checkpoint that verifies
    model.load_state_dict(state["model"])
    # or in place, like torch.distributed.checkpoint.load (objects with
    # state_dict()/load_state_dict() are loaded through them):
    state = {"model": model, "optim": optimizer, "step": 0}
    ckpt.load("/ckpt/run1", into=state)       # state["step"] is the saved step

See docs/python.md. The work is done by the C++ library through the LibTorch
extension `torch.ops.ckpt` (loaded on import); this package only walks the
state and turns non-tensor values into JSON (nothing is pickled).
"""
import torch  # noqa: E402

from . import _lib

_lib.load()

from .checkpointer import AsyncSaveResponse, Checkpointer  # noqa: E402
from .errors import (CheckpointError, CheckpointNotFoundError, CheckpointStalledError,  # noqa: E402
                     CorruptCheckpointError)
from .exporting import export, export_hf  # noqa: E402
from .loading import SkippedCheckpointWarning, describe, list_steps, load, verify  # noqa: E402
from .preemption import (handle_preemption, preempted, preemption_signal,  # noqa: E402
                         preemption_time_left, stop_handling_preemption)

__version__ = torch.ops.ckpt.version()  # the library's, from CMakeLists.txt
__all__ = ["Checkpointer", "AsyncSaveResponse", "load", "list_steps", "describe", "verify", "export", "export_hf",
           "CheckpointError", "CheckpointNotFoundError", "CheckpointStalledError",
           "CorruptCheckpointError",
           "SkippedCheckpointWarning", "library_path", "handle_preemption", "preempted",
           "preemption_signal", "preemption_time_left", "stop_handling_preemption"]


def library_path():
    """Where the LibTorch extension was loaded from."""
    return _lib.load()
