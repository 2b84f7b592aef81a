"""Checkpointer: asynchronous saves of a nested training state."""
import atexit
import concurrent.futures
import json
import math
import numbers
import os
import threading
import time
import weakref

import torch

from . import _lib, _tree
from .errors import translate

EXTRAS_KEY = "ckpt.python"
_DELTA_MODES = ("none", "exact", "topk")


_option_names = None


def _known_options():
    """Engine option names the extension knows, or None if it cannot say."""
    global _option_names
    if _option_names is None:
        try:
            _option_names = frozenset(torch.ops.ckpt.engine_option_names())
        except (AttributeError, RuntimeError):  # an extension built before the op existed
            _option_names = frozenset()
    return _option_names or None


def _check_options(options):
    """`options` (the **options of Checkpointer) checked before they are
    serialized: ValueError naming an unknown option, or one whose value is not
    None, bool, int, a finite float, str or os.PathLike (made str)."""
    known = _known_options()
    out = {}
    for name, value in options.items():
        if known is not None and name not in known:
            raise ValueError(f'ckpt: unknown engine option "{name}" (known: {", ".join(sorted(known))})')
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not (value is None or type(value) in (bool, int, str)
                or (type(value) is float and math.isfinite(value))):
            raise ValueError(f'ckpt: engine option "{name}" is {value!r} (a {type(value).__name__}); '
                             "expected None, a bool, an int, a finite float or a str")
        out[name] = value
    return out


def _number(name, value, kind):
    """`value` as `kind` (int or float), or ValueError naming the parameter:
    bools, strings and other objects are refused rather than converted."""
    ok = isinstance(value, numbers.Integral) if kind is int else isinstance(value, numbers.Real)
    if isinstance(value, bool) or not ok or (kind is float and not math.isfinite(value)):
        raise ValueError(f"ckpt: {name} must be {'an int' if kind is int else 'a finite number'}, "
                         f"got {value!r} (a {type(value).__name__})")
    return kind(value)


def _flag(name, value):
    if not isinstance(value, (bool, int)) or value not in (0, 1):
        raise ValueError(f"ckpt: {name} must be True or False, got {value!r}")
    return bool(value)


class _Future(concurrent.futures.Future):
    """A Future that tells its owner when its exception was handed to the caller
    (by result() or exception()), so the error is reported only once."""

    def __init__(self, on_observed):
        super().__init__()
        self._on_observed = on_observed

    def result(self, timeout=None):
        try:
            return super().result(timeout)
        except BaseException:
            if self.done() and not self.cancelled() and super().exception(0) is not None:
                self._on_observed()
            raise

    def exception(self, timeout=None):
        e = super().exception(timeout)
        if e is not None:
            self._on_observed()
        return e


class AsyncSaveResponse:
    """One save in flight, shaped like torch.distributed.checkpoint's AsyncSaveResponse.

    staging_completion: a Future that completes (result None) once the state's
        tensors are copied into ckpt's staging memory: from then on the caller
        may modify them (e.g. run optimizer.step()).
    upload_completion: a Future that completes once the checkpoint is durably
        committed; its result is the save's statistics (a dict: tensor_bytes,
        file_bytes, blocked_s, staging_s, persist_s, seconds, dir, skipped, ...).
    result(timeout=None): waits for upload_completion and returns its result;
        raises the save's error (ckpt.CheckpointError or a subclass).
    """

    def __init__(self, step, on_observed):
        self.step = step
        self.staging_completion = _Future(lambda: on_observed(self))
        self.upload_completion = _Future(lambda: on_observed(self))
        self.blocked_s = 0.0  # how long save_async held the caller

    def result(self, timeout=None):
        return self.upload_completion.result(timeout)

    def done(self):
        return self.upload_completion.done()

    def __repr__(self):
        state = "done" if self.done() else ("staged" if self.staging_completion.done() else "staging")
        return f"<ckpt.AsyncSaveResponse step={self.step} {state}>"


class Checkpointer:
    """Writes checkpoints of a nested training state into `root`, in the background.

        with ckpt.Checkpointer("/ckpt/run1", delta="exact") as cp:
            for step in ...:
                ...
                if step % 100 == 0:
                    resp = cp.save_async(step, {"model": model.state_dict(),
                                                "optim": optimizer.state_dict(),
                                                "step": step})
                    resp.staging_completion.result()  # returns at once unless lazy=True
                optimizer.step()

    delta: "none" (every save full), "exact" (lossless deltas between full
        saves), or "topk" (lossy: the `topk_ratio` largest changes per tensor).
    full_every: a full save every that many saves (the first is always full).
    lazy: if True, save_async returns before the tensors are copied; wait for
        `staging_completion` before modifying them.
    staging_bytes: fixes the size of the host staging memory (default: it grows
        to the largest save).
    compression: zstd level 1..19 for shard files (None or 0: off).
    options: further engine options by name (see docs/python.md); an unknown
        name, or a value other than None, bool, int, finite float, str or
        os.PathLike, raises ValueError naming it before anything is opened.

    Errors of a save are raised by its response's result() and, if nobody
    saw them there, by the next save_async() (or close()).
    """

    def __init__(self, root, delta="none", topk_ratio=0.01, full_every=10, lazy=False,
                 staging_bytes=None, compression=None, **options):
        _lib.load()
        if delta is None:
            delta = "none"
        if delta not in _DELTA_MODES:
            raise ValueError(f"ckpt: delta must be one of {_DELTA_MODES}, got {delta!r}")
        opts = {"delta": delta,
                "topk_ratio": _number("topk_ratio", topk_ratio, float),
                "full_every": _number("full_every", full_every, int),
                "lazy": _flag("lazy", lazy),
                "compression_level": _number("compression", compression or 0, int)}
        if staging_bytes is not None:
            opts["staging_bytes"] = _number("staging_bytes", staging_bytes, int)
        opts.update(_check_options(options))
        self.root = str(root)
        self.lazy = bool(lazy)
        with translate():
            self._engine = torch.classes.ckpt.Engine(self.root, json.dumps(opts, allow_nan=False))
        self._lock = threading.Lock()
        self._inflight = []  # responses not yet done
        self._failed = []  # responses that failed and whose error nobody saw yet
        self._closed = False
        _live.add(self)

    # -- saving ---------------------------------------------------------

    def save_async(self, step, state):
        """Starts saving `state` as checkpoint `step`; returns an AsyncSaveResponse.

        `state` nests dicts, lists and tuples of tensors, plain values and
        objects with state_dict()/load_state_dict() (nn.Module, optimizer, LR
        scheduler: saved as their state_dict()). Returns once the tensors are
        staged (or at once with lazy=True). Raises TypeError/ValueError,
        writing nothing, if `state` holds a value that cannot be saved (e.g. a
        DTensor or another tensor subclass, naming where it is); raises the
        unreported error of an earlier save.
        """
        start = time.perf_counter()
        self._raise_unreported()
        names, tensors, meta = _tree.flatten(state)
        extras = json.dumps({EXTRAS_KEY: meta}, ensure_ascii=False, allow_nan=False)
        with self._lock:
            if self._closed:
                raise RuntimeError("ckpt: save_async after close()")
        resp = AsyncSaveResponse(int(step), self._mark_observed)
        try:
            with translate():
                handle = torch.ops.ckpt.save_async(self._engine, int(step), names, tensors, extras)
        except Exception:
            # The library reports an earlier save's error here once; those
            # saves are failed, so their errors count as reported.
            self._drain_failed_quietly()
            raise
        resp.blocked_s = time.perf_counter() - start
        resp._handle = handle
        if not self.lazy:
            resp.staging_completion.set_result(None)
        with self._lock:
            self._inflight.append(resp)
        threading.Thread(target=self._watch, args=(resp, handle), daemon=True,
                         name=f"ckpt-save-{step}").start()
        return resp

    def reserve(self, state, wait=False):
        """Allocates and pre-faults the staging memory a save of `state` needs, in the
        background, so the first save_async does not pay for it (about 5 s per GB of
        fresh memory on a VM). Reads only the tensors' sizes. Returns at once unless
        wait=True; a save_async that comes meanwhile waits for the rest. Does nothing
        when staging_bytes fixed the pool. Call it once, with the state you will save
        (an optimizer has its moments only after its first step(), so pass the state
        after that step, or any state with the same names and shapes).
        """
        names, tensors, _ = _tree.flatten(state)
        with translate():
            torch.ops.ckpt.reserve_staging(self._engine, names, tensors, bool(wait))

    def save(self, step, state):
        """save_async(step, state).result(): returns once the checkpoint is durable."""
        return self.save_async(step, state).result()

    def _watch(self, resp, handle):
        try:
            if not resp.staging_completion.done():
                with translate():
                    handle.wait_staged()
                resp.staging_completion.set_result(None)
            with translate():
                handle.wait()
            stats = json.loads(handle.stats_json())
        except BaseException as e:  # noqa: BLE001 -- handed to the futures
            with self._lock:
                self._failed.append(resp)
                if resp in self._inflight:
                    self._inflight.remove(resp)
            if not resp.staging_completion.done():
                resp.staging_completion.set_exception(e)
            resp.upload_completion.set_exception(e)
            return
        with self._lock:
            if resp in self._inflight:
                self._inflight.remove(resp)
        resp.upload_completion.set_result(stats)

    def _mark_observed(self, resp):
        with self._lock:
            if resp in self._failed:
                self._failed.remove(resp)

    def _raise_unreported(self):
        with self._lock:
            if not self._failed:
                return
            resp = self._failed.pop(0)
        raise concurrent.futures.Future.exception(resp.upload_completion, 0)

    def _drain_failed_quietly(self):
        with self._lock:
            pending = list(self._inflight)
        for r in pending:
            concurrent.futures.wait([r.upload_completion])
        with self._lock:
            self._failed.clear()

    # -- state ------------------------------------------------------------

    def wait(self):
        """Waits for every save in flight; raises the first unreported error."""
        with self._lock:
            pending = list(self._inflight)
        concurrent.futures.wait([r.upload_completion for r in pending])
        self._raise_unreported()

    def stats(self):
        """Engine totals (a dict: saves_committed, bytes_committed, last, ...)."""
        return json.loads(self._engine.stats_json())

    @property
    def backend(self):
        return self._engine.backend()

    def close(self, cancel=False):
        """Waits for saves in flight (or abandons them with cancel=True) and stops
        the engine. Raises the first error nobody saw. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if not cancel:
            with self._lock:
                pending = list(self._inflight)
            concurrent.futures.wait([r.upload_completion for r in pending])
        with translate():
            self._engine.close(cancel)
        if not cancel:
            self._raise_unreported()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            try:  # keep what is in flight, but never mask the original error
                self.close()
            except Exception:  # noqa: BLE001
                pass
        return False


# Checkpointers still open at interpreter exit finish their saves first (their
# waiter threads are daemons, which Python would otherwise stop mid-wait).
_live = weakref.WeakSet()


@atexit.register
def _close_all():
    for cp in list(_live):
        try:
            cp.close()
        except Exception:  # noqa: BLE001 -- exiting; the error was the save's to report
            pass
