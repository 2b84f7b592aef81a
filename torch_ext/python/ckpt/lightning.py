"""ckpt.lightning: a Lightning CheckpointIO plugin that saves through ckpt.

    import lightning as L                 # or: import pytorch_lightning as L (>= 2)
    from ckpt.lightning import CkptCheckpointIO

    trainer = L.Trainer(plugins=[CkptCheckpointIO("/ckpt/run1", delta="exact")],
                        callbacks=[ModelCheckpoint(dirpath="ckpts", save_top_k=2, save_last=True)])
    trainer.fit(model, ckpt_path="last")

Each checkpoint Lightning saves becomes one ckpt step of `root`, written in
the background once its tensors are staged (the trainer goes on at once);
the file Lightning names (`ckpts/epoch=2-step=300.ckpt`) is a small pointer
to that step, written once the step is durable. See docs/integrations.md.
"""
import json
import logging
import os
import threading

import torch

from . import _lib
from .checkpointer import Checkpointer
from .errors import translate
from .loading import load

log = logging.getLogger(__name__)

POINTER_FORMAT = "ckpt.lightning/1"
# How long wait() lets the waiter thread write the pointers of finished saves.
_SETTLE_TIMEOUT_S = 60.0
# The record of which pointer files name which steps, in the ckpt root (an
# entry readers and ckpt-retain leave alone: ckpt/maintenance.h, kUnknown).
REGISTRY_NAME = "lightning-checkpoints.json"


def _checkpoint_io_bases():
    """Lightning's CheckpointIO classes that are importable: `lightning`'s and
    the standalone `lightning_fabric`'s (which pytorch_lightning uses)."""
    bases = []
    for module in ("lightning.fabric.plugins.io.checkpoint_io", "lightning_fabric.plugins.io.checkpoint_io"):
        try:
            bases.append(__import__(module, fromlist=["CheckpointIO"]).CheckpointIO)
        except ImportError:
            pass
    if not bases:
        raise ImportError("ckpt.lightning needs lightning or pytorch_lightning >= 2 "
                          "(pip install lightning)")
    return bases


_BASES = _checkpoint_io_bases()


def read_pointer(path):
    """The pointer file `path` as a dict {"format", "root", "step", ...}, or
    None if it is not one (e.g. a checkpoint torch.save wrote)."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
        pointer = json.loads(head.decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(pointer, dict) or pointer.get("format") != POINTER_FORMAT:
        return None
    return pointer


def _write_durably(path, text):
    """Replaces `path` with `text`: a temp file beside it, fsynced, renamed
    over it, the directory fsynced."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    temp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}-{threading.get_ident()}")
    with open(temp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)
    _fsync_dir(directory)


def _fsync_dir(directory):
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CkptCheckpointIO(_BASES[0]):
    """Lightning's CheckpointIO over ckpt: pass it in `Trainer(plugins=[...])`.

    root: the ckpt checkpoint root the steps are written to (its own: steps
        in it that this plugin wrote and nothing needs any more are deleted).
    options: ckpt.Checkpointer's (delta="exact", full_every=10,
        compression="floats", ...); the default writes every save whole.

    save_checkpoint(checkpoint, path) hands Lightning's whole checkpoint dict
    to ckpt.Checkpointer.save_async as the next step of `root` and returns
    once its tensors are staged; the pointer file `path` is written (atomic,
    fsynced) once the step is durable. Every leaf comes back with its type:
    ints, floats (inf and nan included), strings, None, bools, tuples,
    OrderedDicts, nested containers and dict keys of any of those types
    (callbacks' state is keyed by long strings). Values of other types raise
    TypeError naming their place (nothing is pickled).

    load_checkpoint(path) reads the step `path` points to (verified);
    remove_checkpoint(path) removes the pointer and deletes every step of
    `root` that this plugin wrote and nothing needs any more: a step is
    needed while a pointer names it, while a needed delta step applies to it
    (directly or down its chain), and while it is the newest step or in the
    newest step's chain (the next delta is written against that). teardown()
    waits for the saves in flight, writes their pointers and closes the
    engine (a later save opens it again). A file at `path` that is not a
    pointer (a torch.save checkpoint from before) is loaded with torch.load.
    """

    def __init__(self, root, **options):
        _lib.load()
        self.root = os.path.abspath(os.fspath(root))
        self._options = options
        self._save_lock = threading.Lock()  # held while a save starts
        self._lock = threading.RLock()  # GUARDED: everything below
        self._settled = threading.Condition(self._lock)  # notified as `_pending` shrinks
        self._checkpointer = None
        self._next_step = None
        self._pending = {}  # step -> pointer path, saves in flight
        self._dropped = set()  # steps in flight whose path was removed meanwhile
        self._errors = []  # errors of saves in flight, raised by the next call

    # -- saving -------------------------------------------------------------

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        if storage_options is not None:
            raise TypeError("ckpt.lightning.CkptCheckpointIO takes no storage_options "
                            f"(got {storage_options!r}); options go to its constructor")
        self._raise_errors()
        path = os.path.abspath(os.fspath(path))
        info = {"global_step": checkpoint.get("global_step"), "epoch": checkpoint.get("epoch")}
        # Saves start in step order; `_lock` is not held while one starts (it
        # may wait for room in staging memory, which the waiter thread frees,
        # and that thread takes `_lock` in `_committed`).
        with self._save_lock:
            with self._lock:
                cp = self._open()
                step = self._next_step
                self._next_step += 1
                self._pending[step] = path
            try:
                resp = cp.save_async(step, checkpoint)
            except BaseException:
                with self._lock:
                    del self._pending[step]
                raise
        resp.upload_completion.add_done_callback(lambda f: self._committed(step, path, info, f))

    def _open(self):  # REQUIRES: self._lock
        if self._checkpointer is None:
            os.makedirs(self.root, exist_ok=True)
            self._checkpointer = Checkpointer(self.root, **self._options)
            with translate():
                steps = list(torch.ops.ckpt.list_steps(self.root))
            self._next_step = max(steps, default=0) + 1
        return self._checkpointer

    def _committed(self, step, path, info, future):
        """On the waiter thread, once save `step` finished: writes its
        pointer (unless `path` was removed meanwhile), then frees what nothing
        needs. Errors, the save's included, are raised by the next call."""
        with self._lock:
            del self._pending[step]
            self._settled.notify_all()
            dropped = step in self._dropped
            self._dropped.discard(step)
            try:
                future.result()
                registry = self._registry()
                registry["written"] = sorted(set(registry["written"]) | {step})
                if not dropped:
                    _write_durably(path, json.dumps({"format": POINTER_FORMAT, "root": self.root,
                                                     "step": step, **info}))
                    registry["pointers"][path] = step
                self._save_registry(registry)
                self._free_unneeded(registry)
            except Exception as e:  # noqa: BLE001 -- a done-callback: handed to the caller
                self._errors.append(e)

    # -- loading ------------------------------------------------------------

    def load_checkpoint(self, path, map_location=None, weights_only=None):
        path = os.fspath(path)
        pointer = read_pointer(path)
        if pointer is None:  # not ours: a checkpoint torch.save wrote
            return torch.load(path, map_location=map_location, weights_only=weights_only)
        return _load_pointed(path, pointer, map_location, fallback_root=self.root)

    @staticmethod
    def step_of(path):
        """The ckpt step that the Lightning checkpoint `path` points to."""
        pointer = read_pointer(os.fspath(path))
        if pointer is None:
            raise ValueError(f"ckpt: {path} is not a pointer written by CkptCheckpointIO")
        return int(pointer["step"])

    # -- removing -----------------------------------------------------------

    def remove_checkpoint(self, path):
        path = os.path.abspath(os.fspath(path))
        with self._lock:
            for step, pending in self._pending.items():
                if pending == path:
                    self._dropped.add(step)
            registry = self._registry()
            registry["pointers"].pop(path, None)
            if os.path.lexists(path):
                os.remove(path)
                _fsync_dir(os.path.dirname(path))
            self._save_registry(registry)
            self._free_unneeded(registry)

    def _free_unneeded(self, registry):  # REQUIRES: self._lock
        """Deletes the steps this plugin wrote that nothing needs any more."""
        with translate():
            steps, bases = torch.ops.ckpt.checkpoint_bases(self.root)
        base_of = dict(zip(steps, bases))
        needed = set()

        def need(step):
            while step in base_of and step not in needed:
                needed.add(step)
                base = base_of[step]
                if base == -2:  # its manifest does not read back: keep all before it
                    needed.update(s for s in steps if s < step)
                step = base

        for pointer_path, step in list(registry["pointers"].items()):
            pointer = read_pointer(pointer_path)
            if pointer is None or int(pointer["step"]) != step:  # replaced or deleted by someone else
                del registry["pointers"][pointer_path]
                continue
            need(step)
        if steps:
            need(steps[-1])  # the next delta is written against its chain
        free = [s for s in registry["written"] if s in base_of and s not in needed]
        for step in free:
            with translate():
                torch.ops.ckpt.remove_checkpoint(self.root, step)
        registry["written"] = [s for s in registry["written"] if s in base_of and s not in free]
        self._save_registry(registry)

    def _registry(self):  # REQUIRES: self._lock
        try:
            with open(os.path.join(self.root, REGISTRY_NAME), encoding="utf-8") as f:
                registry = json.load(f)
        except FileNotFoundError:
            registry = {}
        registry.setdefault("pointers", {})
        registry.setdefault("written", [])
        return registry

    def _save_registry(self, registry):  # REQUIRES: self._lock
        os.makedirs(self.root, exist_ok=True)
        _write_durably(os.path.join(self.root, REGISTRY_NAME), json.dumps(registry, indent=1, sort_keys=True))

    # -- lifecycle ----------------------------------------------------------

    def wait(self):
        """Waits for the saves in flight and their pointers; raises the first
        error of a save (or of writing its pointer) not raised yet."""
        with self._lock:
            cp = self._checkpointer
        error = None
        if cp is not None:
            try:
                cp.wait()
            except Exception as e:  # noqa: BLE001 -- a save's error is _committed's to record
                error = e
        # The saves are done; their done-callbacks (pointers, freeing) run on
        # the waiter thread right after, and take moments.
        with self._settled:
            if not self._settled.wait_for(lambda: not self._pending, timeout=_SETTLE_TIMEOUT_S):
                raise RuntimeError(f"ckpt.lightning: the pointers of steps {sorted(self._pending)} "
                                   f"were not written within {_SETTLE_TIMEOUT_S} s of their saves")
        self._raise_errors(error)

    def teardown(self):
        """Waits for the saves in flight, writes their pointers and closes the
        engine; raises the first error not raised yet."""
        with self._lock:
            cp, self._checkpointer = self._checkpointer, None
        error = None
        if cp is not None:
            try:
                cp.close()  # (joins the waiter thread: every pointer is written)
            except Exception as e:  # noqa: BLE001 -- a save's error is _committed's to record
                error = e
        self._raise_errors(error)

    def _raise_errors(self, fallback=None):
        """Raises the oldest error not raised yet (a save's, or of writing its
        pointer or freeing steps), else `fallback` if given."""
        with self._lock:
            errors, self._errors = self._errors, []
        if errors:
            raise errors[0]
        if fallback is not None:
            raise fallback


for _base in _BASES[1:]:
    _base.register(CkptCheckpointIO)


def _load_pointed(path, pointer, map_location, fallback_root=None):
    """The checkpoint that pointer file `path` (read: `pointer`) names, read
    from its root (or `fallback_root` when that root is gone, e.g. the run
    moved), tensors placed as `map_location` says."""
    root = pointer["root"]
    if not os.path.isdir(root) and fallback_root is not None:
        root = fallback_root
    if not os.path.isdir(root):
        raise FileNotFoundError(f"ckpt.lightning: {path} points to step {pointer['step']} of the ckpt "
                                f"root {pointer['root']}, which does not exist here")
    state = load(root, step=int(pointer["step"]))
    return state if map_location is None else _map_location(state, map_location)


def _pointer_aware(pl_load):
    """Lightning's `pl_load` (torch.load through fsspec, which
    `LightningModule.load_from_checkpoint` and
    `LightningDataModule.load_from_checkpoint` call), reading a pointer file
    this plugin wrote through ckpt and anything else as before."""
    if getattr(pl_load, "_ckpt_pointer_aware", False):
        return pl_load

    def load_pointer_or_file(path_or_url, map_location=None, *args, **kwargs):
        if isinstance(path_or_url, (str, os.PathLike)):
            pointer = read_pointer(os.fspath(path_or_url))
            if pointer is not None:
                return _load_pointed(os.fspath(path_or_url), pointer, map_location)
        return pl_load(path_or_url, map_location, *args, **kwargs)

    load_pointer_or_file._ckpt_pointer_aware = True
    load_pointer_or_file.__wrapped__ = pl_load
    return load_pointer_or_file


def _hook_load_from_checkpoint():
    """Makes `Model.load_from_checkpoint(pointer)` load the step the pointer
    names (it reads the file with torch.load, not with the trainer's
    CheckpointIO), in each Lightning package that is installed."""
    for module in ("lightning.pytorch.core.saving", "pytorch_lightning.core.saving"):
        try:
            saving = __import__(module, fromlist=["pl_load"])
        except Exception as e:  # noqa: BLE001 -- not installed, or broken: the other package may serve
            log.debug("ckpt.lightning: %s not hooked: %s", module, e)
            continue
        if hasattr(saving, "pl_load"):
            saving.pl_load = _pointer_aware(saving.pl_load)


_hook_load_from_checkpoint()


def _map_location(state, map_location):
    """`state` with its tensors placed as torch.load's `map_location` would:
    a device, a device string, a dict {from: to} (ckpt loads onto the CPU,
    so only "cpu"'s entry counts), or a callable(storage, "cpu") returning
    the storage to use or None (Lightning's default map_location)."""
    if callable(map_location) and not isinstance(map_location, (str, torch.device)):
        return _map_by_callable(state, map_location)
    if isinstance(map_location, dict):
        map_location = map_location.get("cpu", "cpu")
    device = torch.device(map_location)
    if device.type == "cpu":
        return state
    return _moved(state, lambda t: t.to(device))


def _map_by_callable(state, fn):
    def place(t):
        storage = fn(t.untyped_storage(), "cpu")
        return t if storage is None or storage.device.type == "cpu" else t.to(storage.device)
    return _moved(state, place)


def _moved(state, place):
    def move(x):  # (ckpt.load returns only these containers)
        if isinstance(x, torch.Tensor):
            return place(x)
        if isinstance(x, dict):
            out = type(x)((k, move(v)) for k, v in x.items())
            if hasattr(x, "_metadata"):
                out._metadata = x._metadata
            return out
        if isinstance(x, (list, tuple)):
            return type(x)(move(v) for v in x)
        return x

    return move(state)
