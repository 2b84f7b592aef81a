"""Preemption: using the grace period between a scheduler's SIGTERM and its
SIGKILL to finish the saves in flight and take a final one.

    cp = ckpt.Checkpointer("/ckpt/run1")
    cp.handle_preemption(grace_s=25)          # SIGTERM by default
    for step in range(start, steps):
        train_step()
        if cp.preempted:                      # at a step boundary
            cp.save(step, state)              # final save, synchronous
            break
        if step % 100 == 0:
            cp.save_async(step, state)
    cp.close()

The handler is the C++ library's (ckpt/preemption.h): it records the
signal and calls the handler installed before it, nothing else, so it is
safe whatever thread it interrupts and needs no Python bytecode to run. At
the deadline (the signal + grace_s), saves not durable yet are abandoned
(their temp directories removed; the previous checkpoint stays the latest)
and, with exit_at_deadline, the process ends as the signal would have ended
it. A second signal during the grace ends it at once. See docs/python.md,
"Preemption".
"""
import math
import numbers
import signal as _signal

import torch

from .errors import translate

_FORBIDDEN = {_signal.SIGKILL, _signal.SIGSTOP, _signal.SIGSEGV, _signal.SIGBUS, _signal.SIGFPE,
              _signal.SIGILL, _signal.SIGABRT}


def _signal_numbers(signals):
    if isinstance(signals, (int, _signal.Signals)):
        signals = (signals,)
    try:
        listed = list(signals)
    except TypeError:
        raise TypeError(f"ckpt: signals must be a signal or a sequence of signals, got "
                        f"{signals!r}") from None
    if not listed:
        raise ValueError("ckpt: signals is empty")
    numbers_ = []
    for s in listed:
        if isinstance(s, bool) or not isinstance(s, numbers.Integral):
            raise TypeError(f"ckpt: a signal must be an int or signal.Signals, got {s!r}")
        if int(s) in _FORBIDDEN or not 1 <= int(s) <= 64:
            raise ValueError(f"ckpt: cannot handle signal {s!r} for preemption (not SIGKILL, SIGSTOP, "
                             f"SIGSEGV, SIGBUS, SIGFPE, SIGILL or SIGABRT; 1..64)")
        numbers_.append(int(s))
    return numbers_


def handle_preemption(signals=(_signal.SIGTERM,), grace_s=25.0, exit_at_deadline=True,
                      cleanup_allowance_s=3.0):
    """Turns the process preemptible: `signals` (SIGTERM by default) no longer end
    it at once; `preempted()` turns True, saves in flight go on, and what is not
    durable `grace_s` after the signal is abandoned cleanly. With
    exit_at_deadline (default), the process then ends as the signal would have
    ended it (once the abandoned saves are cleaned up, at most
    cleanup_allowance_s later). Leave a margin below the scheduler's grace
    (Slurm KillWait and Kubernetes terminationGracePeriodSeconds: 30 s).

    Process-wide; calling it again with other options replaces the handling
    (not once preempted). A handler installed before (e.g. with
    signal.signal) still runs after ckpt's; one installed after replaces
    ckpt's.
    """
    numbers_ = _signal_numbers(signals)
    for name, value in (("grace_s", grace_s), ("cleanup_allowance_s", cleanup_allowance_s)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or \
                not math.isfinite(value) or value < 0 or (name == "grace_s" and value == 0):
            raise ValueError(f"ckpt: {name} must be a {'positive' if name == 'grace_s' else 'non-negative'} "
                             f"finite number of seconds, got {value!r}")
    if not isinstance(exit_at_deadline, bool):
        raise TypeError(f"ckpt: exit_at_deadline must be a bool, got {exit_at_deadline!r}")
    with translate():
        torch.ops.ckpt.handle_preemption(numbers_, float(grace_s), exit_at_deadline,
                                         float(cleanup_allowance_s))


def stop_handling_preemption():
    """Puts back the handlers that were installed before handle_preemption. A
    deadline already running stays in force for the saves."""
    torch.ops.ckpt.stop_handling_preemption()


def preempted():
    """True once a handled signal arrived in this process (never blocks)."""
    return torch.ops.ckpt.preemption()[0] != 0


def preemption_signal():
    """The signal.Signals that arrived, or None."""
    sig = torch.ops.ckpt.preemption()[0]
    if sig == 0:
        return None
    try:
        return _signal.Signals(sig)
    except ValueError:
        return sig


def preemption_time_left():
    """Seconds until the deadline (0 once it passed), or None before a signal."""
    sig, left = torch.ops.ckpt.preemption()
    return None if sig == 0 else max(0.0, left)
