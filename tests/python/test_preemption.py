"""Preemption (ckpt.handle_preemption / Checkpointer.preempted): a real child
process training a model with saves in flight receives SIGTERM; its in-flight
save and a final save commit and verify, and a resumed run continues
bit-identically from the final step. A second SIGTERM or a SIGKILL during
the drain leaves the previous checkpoint latest and verifying, and the next
writer removes what the unfinished save left. Every wait has a deadline.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import ckpt
from training import assert_same_tree, make_model, state_of, train_step

HERE = os.path.dirname(os.path.abspath(__file__))
DEADLINE_S = 120


def start_worker(root, out, pad_mb):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [env.get("PYTHONPATH"), HERE] if p)
    return subprocess.Popen([sys.executable, os.path.join(HERE, "preemption_worker.py"), root, out,
                             str(pad_mb)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def await_file(proc, path):
    until = time.monotonic() + DEADLINE_S
    while not os.path.exists(path):
        if proc.poll() is not None:
            pytest.fail(f"worker ended ({proc.returncode}) before {path}: {proc.stdout.read().decode()}")
        if time.monotonic() > until:
            proc.kill()
            pytest.fail(f"{path} did not appear within {DEADLINE_S} s")
        time.sleep(0.002)


def await_exit(proc):
    try:
        out, _ = proc.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"worker did not end within {DEADLINE_S} s: {out.decode()}")
    return proc.returncode, out.decode()


def leftovers(root):
    return [n for n in os.listdir(root)
            if n != "LATEST" and not n.startswith("step-") and not n.endswith(".lock")]


def tree_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def test_sigterm_drains_saves_in_flight_and_takes_a_final_save(root, tmp_path):
    out = str(tmp_path)
    proc = start_worker(root, out, pad_mb=48)
    await_file(proc, os.path.join(out, "ready"))
    proc.send_signal(signal.SIGTERM)
    code, log = await_exit(proc)
    assert code == 0, log
    with open(os.path.join(out, "result.json")) as f:
        result = json.load(f)
    final = result["final"]
    assert final is not None and final >= 10, result
    steps = ckpt.list_steps(root)
    # Every save started before the signal committed, and the final one.
    assert steps == [s for s in range(3, final, 3)] + [final], (steps, result)
    assert result["in_flight_step"] in steps
    for step in steps:
        ckpt.verify(root, step)
    assert ckpt.describe(root)["step"] == final
    assert leftovers(root) == []

    # A resumed run continues bit-identically from the final step (on one
    # thread, as the worker trained: the reference's matmuls round alike).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        resume_and_compare(root, final)
    finally:
        torch.set_num_threads(threads)


def resume_and_compare(root, final):
    extra = 4
    model, optimizer = make_model(seed=123)
    state = {"model": model, "optim": optimizer, "step": 0, "rng": torch.get_rng_state()}
    ckpt.load(root, into=state)
    assert state["step"] == final
    torch.set_rng_state(state["rng"])
    resumed_losses = [train_step(model, optimizer, s) for s in range(final + 1, final + extra + 1)]
    ref_model, ref_optimizer = make_model(seed=0)
    ref_losses = [train_step(ref_model, ref_optimizer, s) for s in range(1, final + extra + 1)]
    assert resumed_losses == ref_losses[final:]
    resumed = state_of(model, optimizer, final + extra)
    reference = state_of(ref_model, ref_optimizer, final + extra)
    resumed["rng"] = reference["rng"] = None
    assert_same_tree(reference, resumed)


def written_final_temp(root):
    """The temp directory of the final save (a step past 9, the last one
    started before the signal) once a file in it holds data, else None."""
    for name in os.listdir(root):
        if not name.startswith(".tmp-step-") or int(name[len(".tmp-step-"):][:20]) <= 9:
            continue
        path = os.path.join(root, name)
        try:
            if any(os.path.getsize(os.path.join(path, f)) > 0 for f in os.listdir(path)):
                return name
        except FileNotFoundError:  # committed (renamed) while we looked: the check after the stop says so
            return name
    return None


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_second_signal_during_the_drain_leaves_the_previous_checkpoint(root, tmp_path, second):
    out = str(tmp_path)
    proc = start_worker(root, out, pad_mb=384)  # a final save of ~0.4 GB: the drain takes a while
    await_file(proc, os.path.join(out, "ready"))
    proc.send_signal(signal.SIGTERM)
    await_file(proc, os.path.join(out, "draining"))
    # The second signal must land during the drain: once the final save has
    # written data, the worker is stopped where it is, shown to be mid-save
    # (its temp directory there, nothing newer committed), signalled, and
    # let go -- the signal is the first thing it sees.
    until = time.monotonic() + DEADLINE_S
    while (temp := written_final_temp(root)) is None:
        assert proc.poll() is None and time.monotonic() < until, "the final save never wrote data"
        time.sleep(0.002)
    proc.send_signal(signal.SIGSTOP)
    committed = ckpt.list_steps(root)
    assert os.path.isdir(os.path.join(root, temp)) and max(committed) <= 9, (
        f"the final save ({temp}) committed before the second signal: {committed}")
    proc.send_signal(second)
    proc.send_signal(signal.SIGCONT)
    code, log = await_exit(proc)
    assert code == -second, log
    steps = ckpt.list_steps(root)
    assert steps == committed, log
    latest = ckpt.describe(root)["step"]
    assert latest == steps[-1]
    ckpt.verify(root, latest)
    assert latest % 3 == 0, (latest, steps)  # a save from before the signal
    assert os.path.isdir(os.path.join(root, temp))  # the unfinished save's, until the next writer
    # The next writer removes what the unfinished save left; the root holds
    # its committed checkpoints and nothing else.
    with ckpt.Checkpointer(root):
        assert leftovers(root) == []
        committed = sum(tree_bytes(os.path.join(root, n)) for n in os.listdir(root)
                        if n.startswith("step-"))
        assert tree_bytes(root) - committed < 4096  # LATEST and the lock files


def test_handle_preemption_rejects_bad_arguments():
    with pytest.raises(ValueError, match="SIGKILL"):
        ckpt.handle_preemption(signals=(signal.SIGKILL,))
    with pytest.raises(ValueError, match="grace_s"):
        ckpt.handle_preemption(grace_s=0)
    with pytest.raises(ValueError, match="grace_s"):
        ckpt.handle_preemption(grace_s=float("inf"))
    with pytest.raises(TypeError, match="signal"):
        ckpt.handle_preemption(signals=("TERM",))
    with pytest.raises(TypeError, match="exit_at_deadline"):
        ckpt.handle_preemption(exit_at_deadline=1)
    assert ckpt.preempted() is False
    assert ckpt.preemption_signal() is None
    assert ckpt.preemption_time_left() is None


def test_handle_preemption_can_be_installed_replaced_and_removed(root):
    before = signal.getsignal(signal.SIGUSR2)
    ckpt.handle_preemption(signals=(signal.SIGUSR2,), grace_s=5)
    ckpt.handle_preemption(signals=(signal.SIGUSR2,), grace_s=5)  # the same again: nothing
    ckpt.handle_preemption(signals=[signal.SIGUSR2], grace_s=7, exit_at_deadline=False)
    with ckpt.Checkpointer(root) as cp:
        assert cp.preempted is False
    ckpt.stop_handling_preemption()
    assert signal.getsignal(signal.SIGUSR2) == before


def test_every_rank_takes_the_final_save_at_the_same_step(root, tmp_path):
    """torchrun forwards SIGTERM to every worker, but not at the same instant:
    here only rank 1 gets it. cp.preempted agrees across the group, so both
    ranks take their final save at the same step and it commits."""
    import distributed_workers as workers
    world = workers.run_world("preemption_workers:one_rank_signalled", 2, str(tmp_path / "work"),
                              timeout=120.0, root=root)
    world.check()
    got = [world.value(r) for r in range(2)]
    assert got[0]["final"] == got[1]["final"], got
    assert got[1]["signal"] == int(signal.SIGTERM) and got[0]["signal"] is None, got
    final = got[0]["final"]
    assert ckpt.list_steps(root)[-1] == final
    ckpt.verify(root, final)
    assert ckpt.load(root)["step"] == final
