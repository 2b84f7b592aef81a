"""The saves of one Checkpointer in flight: the threads that wait for them and
the record of failed saves whose error nobody saw yet."""
import collections
import concurrent.futures
import json
import re
import threading

from .errors import translate


def _earlier_failure(error, prefix):
    """Whether `error`, raised by the engine's SaveAsync or Close, is the
    engine's once-only report of an earlier save's failure: its message is
    `prefix` ("ckpt: save of step 8" or "ckpt: close"), the status code and
    the engine's fixed words (libckpt/src/engine.cc, TakeUnreportedError).
    Every other error of those calls starts with other fixed words ("step",
    "tensor", "engine for", ...), so no root or tensor name can look like one."""
    return re.match(re.escape(prefix) + r": [A-Z_]+: an earlier save failed: ", str(error)) is not None


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


class _Saves:
    """The saves of one Checkpointer from save_async until their outcome, the
    threads that wait for them, and the failed saves whose error was neither
    seen on their response nor raised by the Checkpointer yet ("unseen").

    One daemon thread, "ckpt-waiter", waits for the saves to be durable in
    the order they were started and completes their upload_completion. The
    engine commits saves in that order (it persists them one at a time), so
    no save's completion waits behind a later one's. Lazy saves also get one
    "ckpt-stage-waiter", which waits for their staging in the same order (the
    engine stages them in order, on one thread) and completes
    staging_completion: a lazy save is often staged while the save before it
    is still being written, and its staging_completion must not wait for that
    write, as it would behind a single waiter blocked on the earlier save's
    durability. Each thread starts with the first save that needs it and
    exits once stop() was called and its queue is empty. They hold no
    reference to the Checkpointer, so one dropped without close() can be
    collected (its finalizer calls stop()).

    A skipped save (when_busy="skip") is complete when save_async returns and
    is never queued, so it does not wait behind the saves in flight.

    The futures' done-callbacks run on these threads, so a slow callback
    delays the saves after it, and a callback must not wait for another save
    of the same Checkpointer (wait() and close() refuse to from there while
    saves are pending).
    """

    def __init__(self):
        self._cond = threading.Condition()
        self._to_stage = collections.deque()  # lazy saves whose staging nobody waits for yet
        self._to_persist = collections.deque()  # saves whose durability nobody waits for yet
        self._pending = []  # saves whose upload_completion is not set yet, in start order
        self._unseen = []  # failed saves whose error nobody saw yet, in start order
        self._failures = 0  # saves failed so far
        self._threads = {}  # name -> threading.Thread
        self._stopping = False

    def add(self, resp, lazy):
        with self._cond:
            self._pending.append(resp)
            self._to_persist.append(resp)
            self._start("ckpt-waiter", self._to_persist, self._wait_durable)
            if lazy:
                self._to_stage.append(resp)
                self._start("ckpt-stage-waiter", self._to_stage, self._wait_staged)
            self._cond.notify_all()

    def _start(self, name, queue, wait_one):  # REQUIRES: self._cond held
        if name not in self._threads:
            t = threading.Thread(target=self._run, args=(queue, wait_one), name=name, daemon=True)
            t.start()
            self._threads[name] = t

    def _run(self, queue, wait_one):
        while True:
            with self._cond:
                self._cond.wait_for(lambda: queue or self._stopping)
                if not queue:
                    return
                resp = queue.popleft()
            wait_one(resp)

    def _wait_staged(self, resp):
        try:
            with translate():
                resp._handle.wait_staged()
        except BaseException as e:  # noqa: BLE001 -- handed to the futures
            self._settle(resp, e)  # upload_completion fails too, now: it cannot commit
            return
        resp.staging_completion.set_result(None)

    def _wait_durable(self, resp):
        error = stats = None
        try:
            with translate():
                resp._handle.wait()
            stats = json.loads(resp._handle.stats_json())
        except BaseException as e:  # noqa: BLE001 -- handed to the futures
            error = e
        # staging_completion comes first. It is done (eager), or the stage
        # waiter sets it at once: the engine finished this save and, saves
        # staging in order, every one before it.
        concurrent.futures.wait([resp.staging_completion])
        self._settle(resp, error, stats)

    def _settle(self, resp, error, stats=None):
        """Completes `resp` with `error` (recorded as unseen) or `stats`;
        does nothing if it is complete already (its staging failed)."""
        with self._cond:
            if resp not in self._pending:
                return
            self._pending.remove(resp)
            if error is not None:
                self._failures += 1
                if not resp._seen:
                    self._unseen.append(resp)
            self._cond.notify_all()
        if error is None:
            resp.upload_completion.set_result(stats)
            return
        if not resp.staging_completion.done():
            resp.staging_completion.set_exception(error)
        resp.upload_completion.set_exception(error)

    def seen(self, resp):
        """`resp`'s error was handed to the caller by its response."""
        with self._cond:
            resp._seen = True
            if resp in self._unseen:
                self._unseen.remove(resp)

    def take_unseen(self, limit=None):
        """The (first `limit`) unseen failed saves, oldest first, now counted as seen."""
        with self._cond:
            out = self._unseen[:limit]
            del self._unseen[:len(out)]
            for resp in out:
                resp._seen = True
        return out

    def pending(self):
        with self._cond:
            return list(self._pending)

    def catch_up(self):
        """Waits until the saves the engine has finished are settled here (the
        waiters settle them at once), so their errors are recorded."""
        if not self.on_own_thread():
            done = [r.upload_completion for r in self.pending() if r._handle.done()]
            concurrent.futures.wait(done)

    def failures(self):
        with self._cond:
            return self._failures

    def wait_for_failure(self, since):
        """Blocks until more than `since` saves have failed (to wait for the
        record of a save the engine reported failed: it comes at once)."""
        with self._cond:
            self._cond.wait_for(lambda: self._failures > since)

    def on_own_thread(self):
        with self._cond:
            return threading.current_thread() in self._threads.values()

    def stop(self):
        """The threads exit once their queues are empty."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def join(self):
        with self._cond:
            threads = list(self._threads.values())
        for t in threads:
            if t is not threading.current_thread():
                t.join()


def _error(resp):
    return concurrent.futures.Future.exception(resp.upload_completion, 0)
