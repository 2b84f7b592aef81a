"""Holds the Checkpointer's waits on its saves, so a test can decide when the
waiter threads learn a save's outcome (the engine goes on regardless).

    with HeldSaves(monkeypatch) as held:
        r = cp.save_async(1, state)    # wait()/wait_staged() of save 1 block
        ...
        held.release(1)                # or held.release_all()

Every hold has a deadline (DEADLINE_S): a hold nobody releases ends by itself,
so a test that goes wrong fails instead of hanging.
"""
import threading
import time

import torch

DEADLINE_S = 60


class _HeldHandle:
    """The extension's SaveHandle, its waits held until the step is released."""

    def __init__(self, handle, gate, stage_gate, failure=None):
        self._handle = handle
        self._gate = gate
        self._stage_gate = stage_gate
        self._failure = failure

    def wait_staged(self):
        self._stage_gate.wait(DEADLINE_S)
        return self._handle.wait_staged()

    def wait(self):
        self._gate.wait(DEADLINE_S)
        self._handle.wait()
        if self._failure is not None:
            raise RuntimeError(self._failure)

    def done(self):
        # Held, a finished save looks like one the engine has recorded as
        # failed but whose handle is not done yet (the persister records the
        # outcome first, then wakes the handle's waiters).
        return self._gate.is_set() and self._handle.done()

    def skipped(self):
        return self._handle.skipped()

    def stats_json(self):
        return self._handle.stats_json()


class HeldSaves:
    """Replaces torch.ops.ckpt.save_async (for the Checkpointer) while active.
    hold_staging=False leaves wait_staged() alone. on_raise(error) is called
    when the real op raises (before the error reaches the Checkpointer); the
    errors are kept in `raised`. The saves of `fail_steps` fail as the
    Checkpointer sees them: their wait() raises a RuntimeError once the real
    save is done (the engine knows nothing of it, so it reports nothing)."""

    def __init__(self, monkeypatch, hold_staging=True, on_raise=None, fail_steps=()):
        self._monkeypatch = monkeypatch
        self._hold_staging = hold_staging
        self._on_raise = on_raise
        self._fail_steps = set(fail_steps)
        self.raised = []
        self._gates = {}
        self._lock = threading.Lock()
        self._all = threading.Event()

    def _gate(self, step):
        with self._lock:
            if step not in self._gates:
                self._gates[step] = threading.Event()
                if self._all.is_set():
                    self._gates[step].set()
            return self._gates[step]

    def release(self, step):
        self._gate(step).set()

    def release_all(self):
        with self._lock:
            self._all.set()
            for gate in self._gates.values():
                gate.set()

    def __enter__(self):
        real = torch.ops.ckpt.save_async
        free = threading.Event()
        free.set()

        def save_async(engine, step, *args):
            gate = self._gate(step)
            try:
                handle = real(engine, step, *args)
            except Exception as e:
                self.raised.append(e)
                if self._on_raise is not None:
                    self._on_raise(e)
                raise
            failure = f"ckpt: save of step {step}: injected failure" if step in self._fail_steps else None
            return _HeldHandle(handle, gate, gate if self._hold_staging else free, failure)

        self._monkeypatch.setattr(torch.ops.ckpt, "save_async", save_async)
        return self

    def __exit__(self, *exc):
        self.release_all()  # (the monkeypatch ends with the test)
        return False


def wait_until(predicate, what, timeout=30):
    """Polls `predicate` until it is true; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.01)
