"""Rank bodies of the multi-rank preemption test (test_preemption.py), run by
distributed_workers.run_world as "preemption_workers:<function>"."""
import os
import signal

import torch

import ckpt


def one_rank_signalled(ctx):
    """Every rank trains and saves; only rank 1 gets SIGTERM (at step 5).
    Returns (the step of the final save, the signal this rank got)."""
    cp = ckpt.Checkpointer(ctx.root, replicated=True)
    cp.handle_preemption(grace_s=30)
    w = torch.zeros(4096)
    for step in range(1, 1000):
        w += 1  # a training step
        if ctx.rank == 1 and step == 5:
            os.kill(os.getpid(), signal.SIGTERM)
        if cp.preempted:  # a collective: every rank reads it at every step
            cp.save(step, {"w": w, "step": step})
            signalled = ckpt.preemption_signal()
            cp.close()
            return {"final": step, "signal": int(signalled) if signalled is not None else None}
        if step % 2 == 0:
            cp.save_async(step, {"w": w, "step": step})
    raise AssertionError("never preempted")
