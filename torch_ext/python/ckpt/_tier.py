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
"""
import concurrent.futures
import queue
import threading
import time

import torch

from .errors import translate

_ATTEMPTS = 3


class _Tier:
    def __init__(self, root, url, streams, part_bytes, max_upload_rate):
        url = str(url)
        if not url.startswith("s3://"):
            raise ValueError(f"ckpt: tier must be an s3://bucket/prefix URL, got {url!r}")
        if int(streams) < 1 or int(part_bytes) < (5 << 20) or int(max_upload_rate) < 0:
            raise ValueError("ckpt: tier_streams must be >= 1, tier_part_bytes >= 5 MiB (S3's "
                             "smallest part) and tier_max_upload_rate >= 0")
        self.url = url
        self._root = root
        self._args = (int(streams), int(part_bytes), int(max_upload_rate))
        self._queue = queue.Queue()
        self._lock = threading.Lock()
        self._status = {}  # step -> dict; GUARDED_BY(_lock)
        self._thread = threading.Thread(target=self._run, name="ckpt-tier", daemon=True)
        self._thread.start()

    def submit(self, step, future):
        with self._lock:
            self._status[step] = {"state": "pending"}
        self._queue.put((step, future))

    def skip(self, step, future, why):
        with self._lock:
            self._status[step] = {"state": "not uploaded", "reason": why}
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
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                step, future = item
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
            step, future = item
            with self._lock:
                self._status[step] = {"state": "uploading"}
            start = time.perf_counter()
            error = None
            for attempt in range(_ATTEMPTS):
                try:
                    with translate():
                        files, nbytes, already = torch.ops.ckpt.publish_checkpoint(
                            self._root, step, self.url, *self._args)
                    error = None
                    break
                except Exception as e:  # reported below; the save itself stands
                    error = e
                    time.sleep(0.5 * (attempt + 1))
            with self._lock:
                if error is None:
                    result = {"uploaded": True, "durable_in_bucket": True, "url": self.url,
                              "files": files, "bytes": nbytes, "already_there": already,
                              "seconds": time.perf_counter() - start}
                    self._status[step] = {"state": "durable", **result}
                else:
                    self._status[step] = {"state": "failed", "error": str(error)}
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)
            self._queue.task_done()


def new_future():
    return concurrent.futures.Future()
