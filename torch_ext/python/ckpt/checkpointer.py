"""Checkpointer: asynchronous saves of a nested training state."""
import atexit
import concurrent.futures
import json
import os
import signal
import threading
import time
import weakref

import torch

from . import _distributed, _lib, _tier, _tree, preemption
from ._options import _check_options, _flag, _number
from ._saves import _Future, _Saves, _earlier_failure, _error
from .errors import translate

EXTRAS_KEY = "ckpt.python"
_DELTA_MODES = ("none", "exact", "topk")


def _compression(compression):
    """Engine options of Checkpointer's `compression` argument."""
    if compression is None or compression is False or compression == 0:
        return {"compression_level": 0}
    if compression in ("floats", "planes"):
        return {"compression_codec": "planes", "compression_level": 1}
    if compression == "zstd":
        return {"compression_codec": "zstd", "compression_level": 3}
    if isinstance(compression, str):
        raise ValueError(f"ckpt: compression must be None, a zstd level 1..19, \"zstd\" or "
                         f"\"floats\", got {compression!r}")
    return {"compression_level": _number("compression", compression, int)}


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
    tier_completion: with Checkpointer(tier="s3://..."), a Future that
        completes once the checkpoint is durable in the bucket (result: a dict
        with uploaded, durable_in_bucket, files, bytes, seconds), or with the
        upload's error; {"uploaded": False, ...} for a save that failed or was
        skipped. None without a tier.
    """

    def __init__(self, step, on_observed):
        self.step = step
        self.staging_completion = _Future(lambda: on_observed(self))
        self.upload_completion = _Future(lambda: on_observed(self))
        self.blocked_s = 0.0  # how long save_async held the caller
        self.tier_completion = None  # with a tier: durable in the bucket
        self._handle = None  # the extension's SaveHandle
        self._seen = False  # its error was handed out (GUARDED_BY the Checkpointer's _Saves)

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
    staging_reserve_bytes (an option by name): a size hint; that much staging
        memory is allocated and pinned in the background at once, so the first
        save neither waits for pinning (~0.3-0.8 s per GB) nor stages into
        unpinned memory. See also reserve(). Without either, the first save
        grows the pool unpinned and it is pinned after that save is written.
    compression: how full saves are compressed: None or 0 (off), a zstd level
        1..19 (each record zstd), "zstd" (level 3), or "floats" (lossless
        byte-plane grouping, each plane zstd: sizes measured in
        bench/README.md; stored raw where it would slow the save, see
        adaptive_compression in docs/python.md).
    delta_base (an option by name): "differential" (default: each delta
        against the last full save; a restore reads one full and one delta)
        or "chained" (each delta against the previous save).
    options: further engine options by name (see docs/python.md); an unknown
        name, or a value other than None, bool, int, finite float, str or
        os.PathLike, raises ValueError naming it before anything is opened.
    process_group: a multi-rank checkpoint (docs/python.md, "Multi-rank"):
        None (default) joins the default torch.distributed group when it is
        initialized with more than one rank; a ProcessGroup joins that group;
        False, or a group of one rank, opens a single-process checkpointer.
        Every rank of the group opens its own Checkpointer on the same root
        (the same absolute path on every rank), in the same order; opening
        waits until rank 0 has opened (up to commit_timeout_s).
    tier: an s3://bucket/prefix URL: each committed checkpoint is uploaded
        behind the saves (docs/object-storage.md, "Upload behind the save"):
        tier_streams requests at once, multipart parts of tier_part_bytes,
        each stream capped at tier_max_upload_rate bytes/s (0: no cap), the
        objects in tier_storage_class (e.g. "STANDARD_IA"; None: the
        bucket's default; GLACIER and DEEP_ARCHIVE raise ValueError).
        While another job (a ckpt-retain run tiering into the same prefix)
        holds the prefix's lease, an upload waits for it, tier_lease_wait
        seconds at most (default 1800; 0: fail at once), then fails naming
        the holder.
    commit_timeout_s: how long a rank that wrote its part waits for the
        others before the save fails on every rank, naming the missing ranks.
    shared_root: True (default): with a group, root is one directory every
        rank shares (NFS, Lustre, or one machine's disk). False: the ranks'
        machines share no file system (node-local disks); needs tier=. Each
        rank then commits its copy of every step in root/rank-<rank> (the
        checkpoint's manifest and its own part), uploads its part, and rank 0
        writes the step's marker once every part is in the bucket, which is
        where the whole checkpoint lives: load it from tier's URL. A rank's
        copy of a step is removed once a newer step is durable in the
        bucket, unless a delta of that newer step needs it
        (docs/distributed.md, "Ranks that share no file system").
    replicated, rank_local: which tensors are identical on every rank (stored
        once) and which are this rank's own even where other ranks save the
        same name: None, True (every tensor), tensor-name prefixes ("model"
        selects "model.fc.weight"), or a callable(name) -> bool. Tensors
        neither selects must be identical wherever two ranks save the same
        name. Ignored (but checked) without a group. They select among the
        plain tensors: a DTensor is always saved as chunks of its global
        tensor.

    Each failed save's error is raised once: by its response (result() or
    exception() of either future) if the caller looks there first, otherwise
    by the first save_async(), wait() or close() after it failed, and never
    again. Each such call raises one, the oldest; close() raises the oldest
    and names the others in notes (Python 3.11+); close(cancel=True) raises
    none of the saves it abandons. That record is this class's alone (see
    _Saves): the engine's own once-only report of an earlier failure, which
    SaveAsync or Close return when no handle reported it yet (the waiter
    thread was about to), is only a sign to wait for the waiter's record.
    """

    def __init__(self, root, delta="none", topk_ratio=0.01, full_every=10, lazy=False,
                 staging_bytes=None, compression=None, process_group=None, commit_timeout_s=300.0,
                 replicated=None, rank_local=None, tier=None, tier_streams=4,
                 tier_part_bytes=8 << 20, tier_max_upload_rate=0, tier_storage_class=None,
                 tier_lease_wait=1800.0, shared_root=True, **options):
        _lib.load()
        if delta is None:
            delta = "none"
        if delta not in _DELTA_MODES:
            raise ValueError(f"ckpt: delta must be one of {_DELTA_MODES}, got {delta!r}")
        opts = {"delta": delta,
                "topk_ratio": _number("topk_ratio", topk_ratio, float),
                "full_every": _number("full_every", full_every, int),
                "lazy": _flag("lazy", lazy),
                **_compression(compression)}
        if staging_bytes is not None:
            opts["staging_bytes"] = _number("staging_bytes", staging_bytes, int)
        opts.update(_check_options(options))
        commit_timeout_s = _distributed.commit_timeout(commit_timeout_s)
        self._placements = _distributed.Placements(replicated, rank_local)
        group = _distributed.resolve_group(process_group)
        self.root = str(root)
        if self.root.startswith("s3://"):
            raise ValueError(
                f"ckpt: cannot save to {self.root}: saves go to a local (or mounted) directory; "
                f"upload behind the save with Checkpointer(DIR, tier=\"{self.root}\"), or tier with "
                f"`ckpt-retain --root DIR --cold-dir {self.root}`")
        key_prefix = None if group is None else _distributed.next_key_prefix(self.root)
        if not isinstance(shared_root, bool):
            raise TypeError(f"ckpt: shared_root must be True or False, got {shared_root!r}")
        # Ranks that share no file system: each keeps its copy of every step
        # in ROOT/rank-<r>, and the checkpoint is whole only in the bucket.
        self.shared_root = shared_root or group is None
        engine_root = self.root
        if not self.shared_root:
            if tier is None:
                raise ValueError(
                    "ckpt: shared_root=False needs tier=\"s3://BUCKET/PREFIX\": ranks that share no file "
                    "system hold one checkpoint only in a bucket (each rank's directory has its own part)")
            engine_root = os.path.join(self.root, f"rank-{group.rank():05d}")
            os.makedirs(self.root, exist_ok=True)
        self.local_dir = engine_root  # where this rank's engine commits
        self._tier = None if tier is None else _tier._Tier(
            engine_root, tier, tier_streams, tier_part_bytes, tier_max_upload_rate, group, key_prefix,
            tier_storage_class, own_copy=not self.shared_root, lease_wait=tier_lease_wait)
        self.lazy = bool(lazy)
        self.process_group = group  # None: single-process
        options_json = json.dumps(opts, allow_nan=False)
        with translate():
            if group is None:
                self._engine = torch.classes.ckpt.Engine(self.root, options_json)
            else:
                self._engine = torch.ops.ckpt.open_engine(
                    engine_root, options_json, group.boxed(), key_prefix, commit_timeout_s, self.shared_root)
        # Held while a save is started and queued, so the waiter's order is
        # the engine's; GUARDED_BY: _closed.
        self._lock = threading.Lock()
        self._saves = _Saves()
        self._closed = False
        self._preempted = False  # agreed by every rank, once True
        weakref.finalize(self, self._saves.stop).atexit = False
        _live.add(self)

    # -- saving ---------------------------------------------------------

    def save_async(self, step, state):
        """Starts saving `state` as checkpoint `step`; returns an AsyncSaveResponse.

        `state` nests dicts, lists and tuples of tensors, plain values and
        objects with state_dict()/load_state_dict() (nn.Module, optimizer, LR
        scheduler: saved as their state_dict()). DTensors are saved as chunks
        of their global tensors (each box once; docs/python.md, "Sharded
        state"). Returns once the tensors are staged (or at once with
        lazy=True). Raises TypeError/ValueError, writing nothing, if `state`
        holds a value that cannot be saved (e.g. a ShardedTensor or another
        tensor subclass, naming where it is); raises the oldest unseen error
        of an earlier save, starting nothing.
        """
        start = time.perf_counter()
        self._saves.catch_up()  # a save that failed by now is reported now
        self._raise_unseen()
        step = _tree.as_step(step)
        flat = _tree.flatten_for_save(state, multi_rank=self.process_group is not None)
        names, tensors = flat.names, flat.tensors
        placements = self._placements.of(names, sharded=flat.chunks)
        global_shapes, global_offsets = flat.global_shapes_and_offsets()
        extras = json.dumps({EXTRAS_KEY: flat.meta}, ensure_ascii=False, allow_nan=False)
        resp = AsyncSaveResponse(step, self._saves.seen)
        while True:
            with self._lock:
                if self._closed:
                    raise RuntimeError("ckpt: save_async after close()")
                failures = self._saves.failures()
                try:
                    with translate():
                        resp._handle = torch.ops.ckpt.save_async(
                            self._engine, step, names, tensors, extras, placements, global_shapes,
                            global_offsets)
                except Exception as e:
                    if not _earlier_failure(e, f"ckpt: save of step {step}") or \
                            self._saves.on_own_thread():
                        raise
                else:
                    resp.blocked_s = time.perf_counter() - start
                    skipped = resp._handle.skipped()
                    if skipped or not self.lazy:  # (no callbacks yet: nobody has resp)
                        resp.staging_completion.set_result(None)
                    if self._tier is not None:
                        resp.tier_completion = _tier.new_future()
                        resp.upload_completion.add_done_callback(
                            lambda f, resp=resp: self._after_commit(resp, f))
                    if skipped:
                        resp._handle.done()  # (true; drops the inputs the handle held)
                        resp.upload_completion.set_result(json.loads(resp._handle.stats_json()))
                    else:
                        self._saves.add(resp, self.lazy)
                    return resp
            # The engine reported an earlier save's error that no handle had
            # reported yet: its waiter was about to. Wait for the waiter's
            # record and raise that (if nobody saw it meanwhile), so that the
            # error is raised once; else start the save again. (On a waiter
            # thread, in a done-callback, the engine's copy is raised above:
            # the waiter cannot wait for itself.)
            self._saves.wait_for_failure(failures)
            self._raise_unseen()

    def _after_commit(self, resp, future):
        # (The base Future's exception(): this peek must not count as the
        # caller having seen the save's error.)
        error = concurrent.futures.Future.exception(future, 0)
        if error is not None:
            self._tier.skip(resp.step, resp.tier_completion, f"the save failed: {error}")
        elif concurrent.futures.Future.result(future, 0).get("skipped"):
            self._tier.skip(resp.step, resp.tier_completion, "the save was skipped")
        else:
            self._tier.submit(resp.step, resp.tier_completion)

    def tier_status(self, step=None):
        """With tier=: per step, whether it is durable in the bucket: a dict with
        state "pending", "uploading", "durable", "failed" (and error),
        "cancelled" or "not uploaded"; for one `step`, or all."""
        if self._tier is None:
            raise ValueError("ckpt: this Checkpointer has no tier")
        return self._tier.status(step)

    def wait_tier(self, timeout=None):
        """Waits for the saves committed so far to be uploaded (or fail); True
        unless `timeout` seconds passed first. Upload errors are in
        tier_status() and on each save's tier_completion, never raised here."""
        if self._tier is None:
            raise ValueError("ckpt: this Checkpointer has no tier")
        self._wait_pending("wait_tier()")
        return self._tier.wait(timeout)

    def reserve(self, state, wait=False):
        """Allocates, pre-faults and pins the staging memory a save of `state` needs, in
        the background, so the first save_async neither pays for it (0.3-0.8 s per GB
        measured) nor stages into unpinned memory. Reads only the tensors' sizes. Returns at once unless
        wait=True; a save_async that comes meanwhile waits for the rest. Does nothing
        when staging_bytes fixed the pool. Call it once, with the state you will save
        (an optimizer has its moments only after its first step(), so pass the state
        after that step, or any state with the same names and shapes).
        """
        flat = _tree.flatten_for_save(state, multi_rank=self.process_group is not None)
        placements = self._placements.of(flat.names, sharded=flat.chunks)
        global_shapes, global_offsets = flat.global_shapes_and_offsets()
        with translate():
            torch.ops.ckpt.reserve_staging(self._engine, flat.names, flat.tensors, bool(wait),
                                           placements, global_shapes, global_offsets)

    def save(self, step, state):
        """save_async(step, state).result(): returns once the checkpoint is durable."""
        return self.save_async(step, state).result()

    def _raise_unseen(self):
        for resp in self._saves.take_unseen(limit=1):
            raise _error(resp)

    def _refuse_in_callback(self, what):
        """RuntimeError on a waiter thread (in a done-callback) while saves are
        in flight: waiting for them there would never return."""
        if self._saves.on_own_thread() and self._saves.pending():
            raise RuntimeError(f"ckpt: {what} in a done-callback of a save would wait for the "
                               "thread that runs the callback")

    def _wait_pending(self, what):
        self._refuse_in_callback(what)
        concurrent.futures.wait([r.upload_completion for r in self._saves.pending()])

    # -- preemption -------------------------------------------------------

    def handle_preemption(self, signals=(signal.SIGTERM,), grace_s=25.0, exit_at_deadline=True):
        """Makes the process preemptible (ckpt.handle_preemption, process-wide): a
        listed signal no longer ends it at once. Read `preempted` at each step
        boundary; when True, take a final save (save(), synchronous) and leave the
        loop: saves in flight commit first, close() waits for them. What is not
        durable grace_s after the signal is abandoned cleanly (the previous
        checkpoint stays the latest) and, with exit_at_deadline, the process then
        ends as the signal would have ended it. A second signal ends it at once.
        With a process group, call it on every rank (torchrun forwards SIGTERM to
        every worker)."""
        preemption.handle_preemption(signals, grace_s, exit_at_deadline)

    @property
    def preempted(self):
        """True once a handled signal arrived (see handle_preemption); never blocks
        in a single process. With a process group it is True on every rank as soon
        as one rank got the signal, so that all take their final save at the same
        step: reading it is then a collective (an all_reduce of one integer over
        the group), to be read on every rank at the same step boundary."""
        if self._preempted:
            return True
        flag = preemption.preempted()
        if self.process_group is not None:
            flag = _distributed.any_rank(flag, self.process_group)
        self._preempted = flag
        return flag

    # -- state ------------------------------------------------------------

    def wait(self):
        """Waits for every save in flight; raises the oldest unseen error."""
        self._wait_pending("wait()")
        self._raise_unseen()

    def stats(self):
        """Engine totals (a dict: saves_committed, bytes_committed, last, ...)."""
        return json.loads(self._engine.stats_json())

    @property
    def backend(self):
        return self._engine.backend()

    @property
    def rank(self):
        """This process's rank in the checkpoint (0 for a single-process one)."""
        return self._engine.rank()

    @property
    def world_size(self):
        """How many ranks write each checkpoint (1: single-process)."""
        return self._engine.world_size()

    def close(self, cancel=False):
        """Waits for saves in flight (or abandons them with cancel=True) and stops
        the engine and the waiter threads. Raises the oldest unseen error, the
        other unseen ones added as notes; with cancel=True, only of saves that
        had failed before (the abandoned ones' errors stay on their responses).
        Idempotent."""
        if not cancel:
            self._refuse_in_callback("close()")  # (leaving the Checkpointer open)
        with self._lock:
            if self._closed:
                return
            self._closed = True
        abandoned = self._saves.pending() if cancel else []  # (final: no save starts now)
        try:
            if not cancel:
                self._wait_pending("close()")
            try:
                with translate():
                    self._engine.close(cancel)
            except Exception as e:
                # Close returns no other error than the engine's report of a
                # save whose handle had not reported it yet (a cancelled one,
                # or one its waiter was about to wait for): the waiter records
                # it, and the record is what counts, below.
                if not _earlier_failure(e, "ckpt: close"):
                    raise
        finally:
            # The engine finished every save: the waiters drain their queues.
            self._saves.stop()
            self._saves.join()
            if self._tier is not None:
                # Every committed save is queued by now: upload them (or,
                # cancelling, drop the ones not started).
                self._tier.close(cancel)
        unseen = [r for r in self._saves.take_unseen() if r not in abandoned]
        if not unseen:
            return
        first = _error(unseen[0])
        if hasattr(first, "add_note"):  # Python 3.11+
            for resp in unseen[1:]:
                first.add_note(f"ckpt: another save failed unseen: {_error(resp)}")
        raise first

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
