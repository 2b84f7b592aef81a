"""A Checkpointer waits for its saves on one thread ("ckpt-waiter"), plus one
for lazy staging ("ckpt-stage-waiter"), however many saves are in flight; the
threads end with close(), or when an unclosed Checkpointer is collected."""
import concurrent.futures
import gc
import threading

import pytest
import torch

import ckpt
from held_saves import HeldSaves, wait_until

STATE = {"w": torch.ones(1000), "step": 1}


def ckpt_threads():
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("ckpt"))


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_one_waiter_thread_for_many_saves_and_none_after_close(root, monkeypatch, lazy):
    before = threading.active_count()
    assert ckpt_threads() == []
    cp = ckpt.Checkpointer(root, lazy=lazy)
    assert ckpt_threads() == []  # started by the first save
    with HeldSaves(monkeypatch) as held:  # all 40 in flight as the Checkpointer sees them
        responses = [cp.save_async(step, STATE) for step in range(1, 41)]
        want = ["ckpt-stage-waiter", "ckpt-waiter"] if lazy else ["ckpt-waiter"]
        assert ckpt_threads() == want
        assert threading.active_count() == before + len(want)
        held.release_all()
        cp.wait()
    assert all(r.result(timeout=0)["step"] == r.step for r in responses)
    for step in range(41, 61):  # saves one after another reuse the threads
        cp.save(step, STATE)
    assert ckpt_threads() == want
    cp.close()
    assert ckpt_threads() == [] and threading.active_count() == before
    assert ckpt.list_steps(root) == list(range(1, 61))


@pytest.mark.parametrize("cancel", [False, True], ids=["wait", "cancel"])
def test_close_ends_the_threads_with_saves_in_flight(root, cancel):
    before = threading.active_count()
    cp = ckpt.Checkpointer(root, lazy=True)
    state = {"w": torch.randn(8 << 20)}
    responses = [cp.save_async(step, state) for step in range(1, 5)]
    cp.close(cancel=cancel)
    assert ckpt_threads() == [] and threading.active_count() == before
    done, _ = concurrent.futures.wait([r.upload_completion for r in responses], timeout=0)
    assert len(done) == 4


def test_threads_end_when_an_unclosed_checkpointer_is_collected(root):
    cp = ckpt.Checkpointer(root)
    cp.save(1, STATE)
    assert ckpt_threads() == ["ckpt-waiter"]
    del cp
    gc.collect()
    wait_until(lambda: ckpt_threads() == [], "the waiter thread to end")


def test_lazy_staging_completes_while_an_earlier_save_is_being_written(root, monkeypatch):
    """staging_completion of save 2 must not wait for save 1 to be durable
    (here: for the waiter to learn it is), as a single waiter blocked on save
    1's durability would make it."""
    with ckpt.Checkpointer(root, lazy=True) as cp:
        with HeldSaves(monkeypatch, hold_staging=False) as held:
            r1 = cp.save_async(1, STATE)
            r2 = cp.save_async(2, STATE)
            assert r2.staging_completion.result(timeout=30) is None
            assert r1.staging_completion.done() and not r1.done() and not r2.done()
            held.release_all()
        assert r1.result(timeout=60)["step"] == 1 and r2.result(timeout=60)["step"] == 2


def test_done_callbacks_run_in_order_and_cannot_wait_for_their_own_thread(root, monkeypatch):
    order = []
    refused = []

    def on_done(fut, step):
        order.append(step)
        if step == 1:
            try:
                cp.wait()  # save 2 is in flight: this thread would wait for itself
            except RuntimeError as e:
                refused.append(str(e))

    cp = ckpt.Checkpointer(root)
    with HeldSaves(monkeypatch) as held:
        r1, r2 = cp.save_async(1, STATE), cp.save_async(2, STATE)
        r1.upload_completion.add_done_callback(lambda f: on_done(f, 1))
        r2.upload_completion.add_done_callback(lambda f: on_done(f, 2))
        held.release_all()
        cp.wait()
    assert order == [1, 2]
    assert len(refused) == 1 and "done-callback" in refused[0]
    r3 = cp.save_async(3, STATE)
    r3.upload_completion.add_done_callback(lambda f: cp.close())  # nothing left to wait for
    wait_until(lambda: ckpt_threads() == [], "close() in the last callback to end the thread")
    assert ckpt.list_steps(root) == [1, 2, 3]


def test_a_skipped_save_does_not_wait_behind_the_saves_in_flight(root, monkeypatch):
    # As in test_options: 64 MB saves through 80 MB of staging, back to back,
    # so saves after the first find the staging memory busy and are skipped.
    state = {"x": torch.randn(16 << 20)}
    with ckpt.Checkpointer(root, when_busy="skip", staging_bytes=80 << 20) as cp:
        with HeldSaves(monkeypatch) as held:
            responses = [cp.save_async(step, state) for step in range(1, 6)]
            skipped = [r for r in responses[1:] if r.done()]  # done on return
            assert skipped, "no save was skipped although each arrived while the previous one was busy"
            assert all(r.result(timeout=0)["skipped"] for r in skipped)
            assert not responses[0].done()  # held
            held.release_all()
        assert not responses[0].result(timeout=60)["skipped"]
