"""What dcp.async_save blocks for when the storage writer is ckpt's: the copy
of the state into CPU buffers the writer keeps and reuses.

dcp.async_save copies ("stages") the whole state before it returns, so that
training may go on while the copy is written. Given no stager of its own,
DCP uses the storage writer when it is an AsyncStager; otherwise it builds a
DefaultStager for that one save, which allocates fresh CPU memory for every
tensor each time (page faults of the whole state size, on every save). This
stager keeps up to `max_sets` sets of CPU buffers, one per layout (names,
dtypes, shapes), and copies into a set nobody uses any more: a set is in use
while any Python object other than this cache refers to one of its buffers
(DCP holds the staged state until its upload finished, and ckpt's engine has
copied the buffers before that upload can finish: the commit comes after every
rank's part is staged and durable). With no free set and `max_sets` in use,
the copy goes to fresh buffers that are not kept.
"""
import copy
import sys
import threading

import torch


def _dtensor_type():
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return None
    return DTensor


def _references(buffers):
    """Each buffer's reference count, as seen from here (the list, the argument)."""
    return [sys.getrefcount(buffers[i]) for i in range(len(buffers))]


def _unused(buffers, baseline):
    """Whether nothing but the cache refers to any of `buffers` (counted as
    `baseline` was, when only the cache held them)."""
    return all(sys.getrefcount(buffers[i]) <= baseline[i] for i in range(len(buffers)))


class ReusedStaging:
    def __init__(self, max_sets=2):
        self._max_sets = max_sets
        self._sets = []  # (layout, [buffers], [baseline refcounts])
        self._lock = threading.Lock()
        self.reused = 0  # stages that reused a kept set (for tests and stats)

    def stage(self, state_dict):
        dtensor = _dtensor_type()
        leaves = []  # the tensors of state_dict, in walk order (DTensors: their local tensors)
        self._walk(state_dict, dtensor, leaves.append)
        layout = tuple((t.dtype, tuple(t.shape)) for t in leaves)
        buffers = self._take(layout)
        with torch.no_grad():
            for src, dst in zip(leaves, buffers):
                dst.copy_(src)
        it = iter(buffers)
        return self._rebuild(state_dict, dtensor, lambda: next(it))

    def _take(self, layout):
        with self._lock:
            for kept_layout, buffers, baseline in self._sets:
                if kept_layout == layout and _unused(buffers, baseline):
                    self.reused += 1
                    return buffers
            buffers = [torch.empty(shape, dtype=dtype) for dtype, shape in layout]
            if len(self._sets) < self._max_sets:
                self._sets.append((layout, buffers, _references(buffers)))
            return buffers

    def _walk(self, value, dtensor, emit):
        if dtensor is not None and isinstance(value, dtensor):
            emit(value.to_local())
        elif isinstance(value, torch.Tensor):
            emit(value)
        elif isinstance(value, dict):
            for v in value.values():
                self._walk(v, dtensor, emit)
        elif isinstance(value, (list, tuple)):
            for v in value:
                self._walk(v, dtensor, emit)

    def _rebuild(self, value, dtensor, next_buffer):
        if dtensor is not None and isinstance(value, dtensor):
            return dtensor.from_local(next_buffer(), value.device_mesh, value.placements,
                                      run_check=False, shape=value.shape, stride=value.stride())
        if isinstance(value, torch.Tensor):
            return next_buffer()
        if isinstance(value, dict):
            out = copy.copy(value)  # (keeps OrderedDict and its _metadata)
            for k, v in value.items():
                out[k] = self._rebuild(v, dtensor, next_buffer)
            return out
        if isinstance(value, list):
            return [self._rebuild(v, dtensor, next_buffer) for v in value]
        if isinstance(value, tuple):
            items = [self._rebuild(v, dtensor, next_buffer) for v in value]
            return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
        return copy.deepcopy(value)
