"""Upload behind the save: `Checkpointer(root, tier="s3://bucket/prefix")`.

Each checkpoint the Checkpointer commits locally is then published to the
bucket by one background thread, in commit order (a delta after its base),
through `torch.ops.ckpt.publish_checkpoint`: every file uploaded and checked
(by the store's MD5 ETags, else read back), the commit marker written last, under the prefix's lease
(docs/object-storage.md). The extension releases the GIL while it uploads.
Memory: `streams` x `part_bytes`; bandwidth: `max_upload_rate` bytes per
second per stream (0: unlimited). An upload failure never fails the save:
the local checkpoint is durable either way; it is reported on the save's
`tier_completion` Future and by `Checkpointer.tier_status()`.

With a process group (a multi-rank checkpoint), every rank uploads its own
part and one marker is written after all of them (`_GroupPublish`): rank 0
takes the prefix's lease and says "go" through the group's c10d store, each
rank publishes its files (`publish_part`: uploaded and checked) and reports
the list, rank 0 then uploads the step's global manifest and writes the
marker over every rank's files (`commit_published_parts`) and publishes the
result, which every rank reports on its Future. No marker is written unless
every rank's part is up and checked. A rank whose save of the step failed
says so at once (rank 0: instead of "go"; the others: as their part), so
that no rank waits for it. The keys are those of the step's n-th save (every
rank counts alike), so a step saved again after a failure starts afresh.

Ranks that share no file system (Checkpointer(shared_root=False)) each
upload from their own copy of the step; once a step is durable in the
bucket, each rank removes its copies of older steps that the step's delta
chain does not need (`_prune_local_copies`).
"""
import collections
import concurrent.futures
import json
import os
import queue
import socket
import threading
import time

import torch

from .errors import CheckpointError, translate

_ATTEMPTS = 3
# How long the ranks of a multi-rank upload wait for one another (a rank's
# whole part, rank 0's marker); the lease rank 0 holds lasts as long.
_GROUP_PATIENCE_S = 3600.0
# How long rank 0 waits, at most, for every rank to have read the result
# before it lets its own upload end (its process may host the store).
_SEEN_PATIENCE_S = 10.0


def _lease_held(error):
    """Whether `error` is "another job holds the prefix's lease" (ObjectLease::Acquire's
    kUnavailable, which names the lease object and its holder)."""
    return getattr(error, "code", None) == "UNAVAILABLE" and ".ckpt-retain.lease is held by" in str(error)


def _with_retries(call, tier=None):
    """call() with up to _ATTEMPTS tries (0.5 s, 1 s between them); its
    result, or raises the last try's error. With `tier`: while another job
    (a ckpt-retain run) holds the prefix's lease, waits for it -- tried again
    after 1 s, then at growing intervals up to 10 s, for tier.lease_wait s at
    most, counted as no try -- and a close(cancel=True) ends the wait."""
    attempt, waited_since, pause = 0, None, 1.0
    while True:
        try:
            with translate():
                return call()
        except Exception as e:  # the caller reports the last one; the save itself stands
            if tier is not None and _lease_held(e):
                now = time.monotonic()
                waited_since = now if waited_since is None else waited_since
                if now - waited_since >= tier.lease_wait:
                    if tier.lease_wait <= 0:
                        raise
                    raise CheckpointError(f"{e} (waited {now - waited_since:.0f} s for it)") from None
                until = now + min(pause, tier.lease_wait - (now - waited_since))
                while time.monotonic() < until:
                    if tier.stopping:
                        raise _Cancelled(f"ckpt: the Checkpointer was closed with cancel=True while the "
                                         f"upload waited for the lease: {e}") from None
                    time.sleep(min(0.1, max(0.0, until - time.monotonic())))
                pause = min(pause * 2, 10.0)
                continue
            attempt += 1
            if attempt == _ATTEMPTS:
                raise
            time.sleep(0.5 * attempt)


class _Cancelled(CheckpointError):
    """An upload ended by close(cancel=True) while it waited."""


class _GroupPublish:
    """One step's multi-rank upload on this rank (see the module)."""

    def __init__(self, tier, step, round_):
        self.tier, self.step = tier, step
        self.rank, self.world = tier.group.rank(), tier.group.size()
        self.base = f"{tier.key_prefix}/tier/{step}/{round_}"

    def _set(self, key, value):
        code, message = torch.ops.ckpt._store_op(self.tier.group.boxed(), "set", f"{self.base}/{key}",
                                                 value, 0.0)
        if code:
            raise CheckpointError(f"ckpt: upload of step {self.step}: the process group's store: "
                                  f"{code}: {message}")

    def _get(self, key, patience=_GROUP_PATIENCE_S):
        """The value of `key`, waited for in 1 s slices (so that close(cancel)
        ends the wait, raising); None after `patience`."""
        deadline = time.monotonic() + patience
        while True:
            code, value = torch.ops.ckpt._store_op(self.tier.group.boxed(), "get", f"{self.base}/{key}", "",
                                                   min(1.0, max(0.001, deadline - time.monotonic())))
            if not code:
                return value
            if code != "DEADLINE_EXCEEDED":
                raise CheckpointError(f"ckpt: upload of step {self.step}: the process group's store: "
                                      f"{code}: {value}")
            if self.tier.stopping:
                raise CheckpointError(f"ckpt: upload of step {self.step}: the Checkpointer was closed "
                                      "with cancel=True while the ranks waited for one another")
            if time.monotonic() >= deadline:
                return None

    def _part(self):
        """This rank's files, uploaded and checked: its report."""
        try:
            return {"ok": True, **json.loads(_with_retries(lambda: torch.ops.ckpt.publish_part(
                self.tier.root, self.step, self.tier.url, self.rank, *self.tier.args,
                own_copy=self.tier.own_copy)))}
        except Exception as e:  # reported to rank 0, which writes no marker
            return {"ok": False, "error": str(e)}

    def _commit(self, reports):
        """Rank 0: the marker over every rank's files, or why not."""
        failed = [f"rank {r}: {rep['error']}" for r, rep in enumerate(reports) if not rep["ok"]]
        if failed:
            return {"ok": False, "error": "no commit marker written, a rank's part did not upload: "
                    + "; ".join(failed)}
        files = [f for rep in reports for f in rep["files"]]
        try:
            n, _, already = _with_retries(lambda: torch.ops.ckpt.commit_published_parts(
                self.tier.root, self.step, self.tier.url, json.dumps(files), *self.tier.args,
                copy_of=self.rank if self.tier.own_copy else -1))
        except Exception as e:  # every rank reports it
            return {"ok": False, "error": str(e)}
        return {"ok": True, "files": len(files) + n, "bytes": sum(r["bytes"] for r in reports),
                "already_there": already and all(r["already_there"] for r in reports)}

    def report_failed_save(self, why):
        """This rank's save of the step failed: tells the others at once
        (rank 0 in place of its "go", the others as their part)."""
        if self.rank == 0:
            self._set("go", f"error: rank 0's save of the step failed: {why}")
        else:
            self._set(f"part/{self.rank}", json.dumps({"ok": False, "error": f"its save failed: {why}",
                                                       "save_failed": True}))

    def run(self):
        """The step's result on this rank: a dict, or raises why it is not in the bucket."""
        lease = None
        try:
            if self.rank == 0:
                try:
                    lease = _with_retries(lambda: torch.classes.ckpt.TierLease(
                        self.tier.url, f"ckpt Checkpointer {socket.gethostname()} pid {os.getpid()} "
                        f"for {self.tier.root} ({self.world} ranks)", _GROUP_PATIENCE_S), self.tier)
                except Exception as e:
                    self._set("go", f"error: rank 0 could not take the bucket's lease: {e}")
                    raise
                self._set("go", "ok")
            else:
                go = self._get("go")
                if go is None:
                    raise CheckpointError(f"ckpt: upload of step {self.step}: no word from rank 0 within "
                                          f"{_GROUP_PATIENCE_S:.0f} s")
                if go != "ok":
                    raise CheckpointError(f"ckpt: upload of step {self.step}: {go.removeprefix('error: ')}")
            mine = self._part()
            if self.rank != 0:
                self._set(f"part/{self.rank}", json.dumps(mine))
                got = self._get("result")
                if got is None:
                    raise CheckpointError(f"ckpt: upload of step {self.step}: no result from rank 0 within "
                                          f"{_GROUP_PATIENCE_S:.0f} s")
                self._set(f"seen/{self.rank}", "1")
                result = json.loads(got)
            else:
                reports = [mine]
                for r in range(1, self.world):
                    got = self._get(f"part/{r}")
                    reports.append(json.loads(got) if got is not None else
                                   {"ok": False, "error": f"no report within {_GROUP_PATIENCE_S:.0f} s"})
                result = self._commit(reports)
                self._set("result", json.dumps(result))
                for r in range(1, self.world):  # before this process may take the store away
                    if reports[r].get("save_failed"):
                        continue  # that rank is not waiting for the result
                    if self._get(f"seen/{r}", _SEEN_PATIENCE_S) is None:
                        break
            if not result["ok"]:
                raise CheckpointError(f"ckpt: upload of step {self.step} to {self.tier.url}: {result['error']}")
            return {"files": result["files"], "bytes": result["bytes"], "already_there": result["already_there"],
                    "rank_bytes": mine.get("bytes", 0)}
        finally:
            if lease is not None:
                lease.release()


class _Tier:
    def __init__(self, root, url, streams, part_bytes, max_upload_rate, group=None, key_prefix=None,
                 storage_class=None, own_copy=False, lease_wait=1800.0):
        url = str(url)
        if not url.startswith("s3://"):
            raise ValueError(f"ckpt: tier must be an s3://bucket/prefix URL, got {url!r}")
        if int(streams) < 1 or int(part_bytes) < (5 << 20) or int(max_upload_rate) < 0:
            raise ValueError("ckpt: tier_streams must be >= 1, tier_part_bytes >= 5 MiB (S3's "
                             "smallest part) and tier_max_upload_rate >= 0")
        if isinstance(lease_wait, bool) or not isinstance(lease_wait, (int, float)) or \
                not lease_wait >= 0 or lease_wait == float("inf"):
            raise ValueError(f"ckpt: tier_lease_wait must be a finite number of seconds >= 0, "
                             f"got {lease_wait!r}")
        self.lease_wait = float(lease_wait)
        self.url = url
        self.root = root
        storage_class = "" if storage_class is None else str(storage_class)
        try:
            torch.ops.ckpt.check_storage_class(storage_class)
        except ValueError as e:
            raise ValueError(f"ckpt: tier_storage_class: {e}") from None
        self.args = (int(streams), int(part_bytes), int(max_upload_rate), storage_class)
        # With a process group of several ranks: each uploads its part (_GroupPublish).
        self.group = group if group is not None and group.size() > 1 else None
        self.key_prefix = key_prefix
        self.own_copy = own_copy
        self._rounds = collections.Counter()  # step -> saves of it seen (group keys)
        self.stopping = False
        self._queue = queue.Queue()
        self._lock = threading.Lock()
        self._status = {}  # step -> dict; GUARDED_BY(_lock)
        self._thread = threading.Thread(target=self._run, name="ckpt-tier", daemon=True)
        self._thread.start()

    def _begin(self, step, status):
        """Records `step`'s status; returns which save of the step this is."""
        with self._lock:
            self._status[step] = status
            self._rounds[step] += 1
            return self._rounds[step] - 1

    def submit(self, step, future):
        round_ = self._begin(step, {"state": "pending"})
        self._queue.put((step, future, round_))

    def skip(self, step, future, why):
        round_ = self._begin(step, {"state": "not uploaded", "reason": why})
        if self.group is not None:
            try:  # so that no rank waits for this one's part
                _GroupPublish(self, step, round_).report_failed_save(why)
            except Exception:  # noqa: BLE001 -- the others then give up after their patience
                pass
        future.set_result({"uploaded": False, "reason": why})

    def status(self, step=None):
        with self._lock:
            if step is not None:
                return dict(self._status.get(int(step), {"state": "unknown"}))
            return {s: dict(v) for s, v in self._status.items()}

    def wait(self, timeout=None):
        """Waits until every upload submitted so far is finished (or `timeout` s)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def close(self, cancel=False):
        if cancel:
            self.stopping = True
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                step, future, _ = item
                with self._lock:
                    self._status[step] = {"state": "cancelled"}
                future.cancel()
                self._queue.task_done()
        self._queue.put(None)
        self._thread.join()

    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:
                self._queue.task_done()
                return
            step, future, round_ = item
            with self._lock:
                self._status[step] = {"state": "uploading"}
            start = time.perf_counter()
            error = extra = None
            if self.group is not None:
                try:
                    extra = _GroupPublish(self, step, round_).run()
                    files, nbytes, already = extra.pop("files"), extra.pop("bytes"), extra.pop("already_there")
                except Exception as e:  # reported below; the save itself stands
                    error = e
            else:
                try:
                    files, nbytes, already = _with_retries(lambda: torch.ops.ckpt.publish_checkpoint(
                        self.root, step, self.url, *self.args), self)
                except Exception as e:  # reported below; the save itself stands
                    error = e
            with self._lock:
                if error is None:
                    result = {"uploaded": True, "durable_in_bucket": True, "url": self.url,
                              "files": files, "bytes": nbytes, "already_there": already,
                              "seconds": time.perf_counter() - start, **(extra or {})}
                    self._status[step] = {"state": "durable", **result}
                elif isinstance(error, _Cancelled):
                    self._status[step] = {"state": "cancelled", "error": str(error)}
                else:
                    self._status[step] = {"state": "failed", "error": str(error)}
            if error is None and self.own_copy:
                try:
                    _prune_local_copies(self.root, step)
                except Exception:  # noqa: BLE001 -- the next durable step tries again
                    pass
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)
            self._queue.task_done()


def _base_of(root, step):
    """The step `step`'s copy in `root` is a delta of; -1 for a full one; -2
    when its manifest does not read back. (A rank's copy holds only its own
    part, which torch.ops.ckpt.checkpoint_bases cannot summarize.)"""
    try:
        with open(os.path.join(root, f"step-{step:020d}", "MANIFEST.json"), encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return -2
    if manifest.get("kind") != "delta":
        return -1
    base = manifest.get("base")
    return base["step"] if isinstance(base, dict) and isinstance(base.get("step"), int) else -2


def _prune_local_copies(root, durable):
    """Removes this rank's copies in `root` of the steps older than `durable`
    (now in the bucket) that its delta chain does not need: the engine takes
    its next delta against that chain (or a newer step), and a copy is never
    the whole checkpoint. Nothing is removed while a base in the chain is
    unknown."""
    keep, step = {durable}, durable
    while (step := _base_of(root, step)) >= 0 and step not in keep:
        keep.add(step)
    if step == -2:
        return
    for s in torch.ops.ckpt.list_steps(root):
        if s < durable and s not in keep:
            torch.ops.ckpt.remove_checkpoint(root, s)  # through a trash name, as ckpt-retain does


def new_future():
    return concurrent.futures.Future()
