"""ckpt.dcp.StorageWriter: torch.distributed.checkpoint saves into a ckpt root.

    dcp.save(state, storage_writer=ckpt.dcp.StorageWriter("/ckpt/run1"), checkpoint_id=step)

Each dcp.save (or async_save) becomes one ckpt checkpoint, step-<n>, written
by ckpt's engine (io_uring/O_DIRECT, XXH3 per record) and committed once for
all ranks: DCP's save is, per rank, write_data (every rank) then finish (the
coordinator, after every rank's write_data returned). Every rank but the
coordinator starts its engine save in write_data and returns at once (the
engine stages lazily: nothing DCP hands a writer changes before the commit); the coordinator starts its own in finish, with DCP's
metadata (which exists only then) in the checkpoint's extras, and waits for
the commit, which ckpt's multi-rank protocol takes only once every rank's
part is durable. So dcp.save returns once the checkpoint is committed, and a
crash at any point leaves no visible step. Item placement: _layout.py.
"""
import base64
import dataclasses
import json
import os
import threading
import uuid

import torch

from .. import _distributed, _lib
from .._distributed import DEFAULT, SHARDED
from .._options import _check_options, _number
from ..checkpointer import _compression
from ..errors import translate
from . import _engines, _layout, _metadata, _staging, _steps
from .errors import DcpError

EXTRAS_KEY = "ckpt.dcp"
FORMAT = 1

_steps.require_dcp()
from torch.distributed.checkpoint import StorageWriter as _DcpStorageWriter  # noqa: E402
from torch.distributed.checkpoint.metadata import StorageMeta  # noqa: E402
from torch.distributed.checkpoint.storage import WriteResult  # noqa: E402

try:  # torch >= 2.4; DCP then stages async_save through the writer (see _staging)
    from torch.distributed.checkpoint.staging import AsyncStager as _AsyncStager  # noqa: E402
except ImportError:  # pragma: no cover
    _AsyncStager = object


def _bytes_tensor(blob):
    """A uint8 tensor holding the bytes of a BytesIO (copied)."""
    data = bytes(blob.getbuffer())
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else \
        torch.empty(0, dtype=torch.uint8)


class StorageWriter(_DcpStorageWriter, _AsyncStager):
    """A DCP StorageWriter that writes each save as one ckpt checkpoint of `root`.

    root: the ckpt root (created if missing), shared by every rank.
    checkpoint_id (of dcp.save/async_save): the step, as an int, "step-<n>" or
        root/step-<n>; without one, the step after the newest in root.
    delta, full_every, topk_ratio, compression: as ckpt.Checkpointer: exact
        or top-k deltas between full saves, "floats" compression of full saves.
    process_group: the group whose ranks write together (default: the
        default group when initialized with more than one rank); must be the
        group dcp.save runs on.
    commit_timeout_s: how long a rank waits for the others' parts.
    thread_count: threads that copy a save into ckpt's staging memory
        (the engine's staging_threads; FileSystemWriter's knob of that name
        counts its writer threads; ckpt writes through io_uring).
    reuse_staging: dcp.async_save without an async_stager stages through
        this writer: into CPU buffers it keeps (two sets at most) and reuses
        across saves, instead of DCP's fresh allocation per save. False:
        fresh buffers each time, as DCP's DefaultStager.
    options: further engine options by name (docs/python.md).
    """

    _synchronize_after_execute = False  # (AsyncStager: stage() is synchronous)

    def __init__(self, root, delta="none", full_every=10, topk_ratio=0.01, compression=None,
                 process_group=None, commit_timeout_s=300.0, thread_count=None,
                 reuse_staging=True, **options):
        super().__init__()
        _lib.load()
        # Lazy staging: nothing DCP hands a writer changes before the save
        # commits (dcp.save returns, and async_save releases its staged copy,
        # only then), so no rank waits for its copy; copies and writes overlap.
        opts = {"lazy": True,
                "delta": delta or "none", "full_every": _number("full_every", full_every, int),
                "topk_ratio": _number("topk_ratio", topk_ratio, float), **_compression(compression)}
        if opts["delta"] not in ("none", "exact", "topk"):
            raise ValueError(f"ckpt.dcp: delta must be none, exact or topk, got {delta!r}")
        if thread_count is not None:
            opts["staging_threads"] = _number("thread_count", thread_count, int)
        opts.update(_check_options(options))
        self.root = os.path.abspath(os.fspath(root))
        self._options_json = json.dumps(opts, sort_keys=True, allow_nan=False)
        self._commit_timeout_s = _distributed.commit_timeout(commit_timeout_s)
        self._group_arg = process_group
        self._staging = _staging.ReusedStaging(max_sets=2 if reuse_staging else 0)
        self._init_shared()

    def _init_shared(self):
        # DCP drives one save through reset, set_up_storage_writer, the plans,
        # write_data and finish, all on one thread; each dcp.async_save runs
        # on a thread of its own, so saves of one writer may overlap (the
        # next one starts before the last was waited for). What belongs to one
        # save is therefore kept per thread; what outlives a save is shared.
        self._save_state = _SaveState()
        self._lock = threading.Lock()
        self._pending = []  # this rank's saves whose commit nobody waited for yet
        self._highest_planned = None  # the highest step planned here (steps picked for no id)

    # The process-based async_save pickles the writer into its own process:
    # only the configuration travels (that process opens its own engine, on
    # its own default group).
    def __getstate__(self):
        state = dict(self.__dict__)
        for name in ("_save_state", "_lock", "_pending", "_highest_planned"):
            state.pop(name)
        state.update(_group_arg=None, _staging=None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._init_shared()

    @property
    def _step(self):  # (from checkpoint_id, for this thread's save)
        return self._save_state.step

    # -- AsyncStager: what dcp.async_save blocks for ----------------------------

    def stage(self, state_dict):
        """A copy of `state_dict` (tensors in CPU buffers this writer reuses)."""
        if self._staging is None:  # (a copy made by pickling: it keeps no buffers)
            self._staging = _staging.ReusedStaging(max_sets=0)
        return self._staging.stage(state_dict)

    def synchronize_staging(self):
        pass

    def close(self):
        pass

    @property
    def checkpoint_id(self):
        return None if self._step is None else os.path.join(self.root, f"step-{self._step:014d}")

    def reset(self, checkpoint_id=None):
        self._save_state.__init__()
        if checkpoint_id is not None:
            self._save_state.step = _steps.parse_checkpoint_id(checkpoint_id, self.root)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        try:
            _steps.parse_checkpoint_id(checkpoint_id, os.path.dirname(os.fspath(checkpoint_id)))
        except (DcpError, TypeError):
            return False
        return True

    def storage_meta(self):
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=str(uuid.uuid4()))

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        save = self._save_state
        save.group = _distributed.resolve_group(self._group_arg)
        if kwargs.get("use_collectives", True) is False and save.group is not None:
            raise DcpError("ckpt.dcp: dcp.save(use_collectives=False) writes each rank's part "
                           "alone; a ckpt checkpoint commits once for all ranks, which needs the "
                           "collectives")
        save.is_coordinator = bool(is_coordinator)
        self._collect_pending()
        os.makedirs(self.root, exist_ok=True)  # (as FileSystemWriter: parents too)
        save.engine = _engines.engine_for(self.root, self._options_json, save.group,
                                          self._commit_timeout_s)

    def _collect_pending(self):
        """Waits for this rank's earlier saves (committed by now, unless one
        failed: its error is raised here, once)."""
        with self._lock:
            pending, self._pending = self._pending, []
        errors = []
        for handle in pending:
            try:
                with translate():
                    handle.wait()
            except Exception as e:  # noqa: BLE001 -- each is waited for; the first is raised
                errors.append(e)
        if errors:
            raise errors[0]

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        group = self._save_state.group
        world = 1 if group is None else group.size()
        if len(plans) != world:
            raise DcpError(f"ckpt.dcp: dcp.save runs on {len(plans)} ranks but the writer's group "
                           f"has {world}; pass the group dcp.save uses as process_group=")
        step = self._plan_step(self._step)
        places = _layout.assign(plans, multi_rank=world > 1)
        return [dataclasses.replace(plan, storage_data=_layout.PlanData(step, own))
                for plan, own in zip(plans, places)]

    def _plan_step(self, step):
        """`step`, or for a save given no checkpoint_id the step after both
        the newest in root and any this writer planned (a save still running
        has not committed its step yet)."""
        with self._lock:
            if step is None:
                step = _steps.next_step(self.root)
                if self._highest_planned is not None:
                    step = max(step, self._highest_planned + 1)
            if self._highest_planned is None or step > self._highest_planned:
                self._highest_planned = step
            return step

    def write_data(self, plan, planner):
        data = plan.storage_data
        if not isinstance(data, _layout.PlanData):
            raise DcpError("ckpt.dcp: the save plan carries no ckpt placement; the coordinator's "
                           "writer is not a ckpt.dcp.StorageWriter")
        state = self._save_state
        save = _Save(data.step, state.group is not None)
        results = []
        for item in plan.items:
            place = data.places[item.index]
            value = planner.resolve_data(item)
            if item.tensor_data is None:
                tensor = _bytes_tensor(value)
                place = dataclasses.replace(place, global_shape=(tensor.numel(),))
            else:
                tensor = value.detach()
                if not tensor.is_contiguous():
                    tensor = tensor.contiguous()
            save.add(place, tensor)
            results.append(WriteResult(index=item.index,
                                       size_in_bytes=tensor.numel() * tensor.element_size(),
                                       storage_data=place.stored()))
        if state.is_coordinator:
            state.stash = save
        else:
            handle = save.start(state.engine, "{}")
            with self._lock:
                self._pending.append(handle)
        future = torch.futures.Future()
        future.set_result(results)
        return future

    def finish(self, metadata, results):
        state = self._save_state
        save, state.stash = state.stash, None
        if save is None:
            raise DcpError("ckpt.dcp: finish() without write_data() on the coordinator")
        metadata.storage_data = {r.index: r.storage_data for rank in results for r in rank}
        blob = base64.b64encode(_metadata.dump_metadata(metadata)).decode("ascii")
        extras = json.dumps({EXTRAS_KEY: {"format": FORMAT, "metadata": blob}})
        handle = save.start(state.engine, extras)
        state.step = None
        with translate():
            handle.wait()


class _SaveState(threading.local):
    """What one save of a writer holds between DCP's calls (per thread)."""

    def __init__(self):
        self.step = None  # from checkpoint_id
        self.engine = None
        self.group = None
        self.is_coordinator = True
        self.stash = None  # the coordinator's part, started in finish()


class _Save:
    """One rank's part of a save: names, tensors and where they lie."""

    def __init__(self, step, multi_rank):
        self.step = step
        self.multi_rank = multi_rank
        self.names, self.tensors, self.placements = [], [], []
        self.global_shapes, self.global_offsets = [], []

    def add(self, place, tensor):
        self.names.append(place.name)
        self.tensors.append(tensor)
        self.placements.append(SHARDED if place.sharded else DEFAULT)
        shape = place.global_shape if place.sharded else tuple(tensor.shape)
        self.global_shapes.append(list(shape))
        self.global_offsets.append(list(place.offset) if place.sharded else [0] * tensor.dim())

    def start(self, engine, extras_json):
        """Starts the engine's save (lazy: the copy runs in the background);
        returns its handle."""
        sharded = self.multi_rank and self.names
        with translate():
            return torch.ops.ckpt.save_async(
                engine, self.step, self.names, self.tensors, extras_json,
                self.placements if self.multi_rank else [],
                self.global_shapes if sharded else None, self.global_offsets if sharded else None)
