"""Each failed save's error is raised once: by its response if the caller looks
there, otherwise by the next save_async(), wait() or close() — never twice,
never not at all.

A save fails in the background when its root is gone: the engine cannot
create the save's temp directory (the root, moved aside, comes back before the
next save).
"""
import concurrent.futures
import os
import sys

import pytest
import torch

import ckpt
from held_saves import HeldSaves, wait_until

STATE = {"w": torch.ones(1000), "step": 1}


def failed_save(cp, root, step):
    """Starts save `step` with the root gone and waits (without looking at the
    response's error) until it failed; puts the root back."""
    os.rename(root, root + ".aside")
    resp = cp.save_async(step, STATE)
    done, _ = concurrent.futures.wait([resp.upload_completion], timeout=60)
    os.rename(root + ".aside", root)
    assert done, f"save {step} did not finish"
    return resp


def failed_saves(cp, monkeypatch, *steps):
    """Saves `steps`, each of which fails as the Checkpointer sees it (an
    injected error: two real ones cannot be had without the first reported by
    the second's save_async), and waits until they did."""
    with HeldSaves(monkeypatch, fail_steps=steps) as held:
        responses = [cp.save_async(step, STATE) for step in steps]
        held.release_all()
    done, _ = concurrent.futures.wait([r.upload_completion for r in responses], timeout=60)
    assert len(done) == len(steps), "the waiter did not complete the responses"
    return responses


def error_of(resp):
    return concurrent.futures.Future.exception(resp.upload_completion, 0)  # (not "seen")


def test_error_seen_on_the_response_is_not_raised_again(root, monkeypatch):
    cp = ckpt.Checkpointer(root)
    cp.save(1, STATE)
    r2 = failed_save(cp, root, 2)
    with pytest.raises(ckpt.CheckpointError, match="save of step 2"):
        r2.result(timeout=0)
    r3 = failed_save(cp, root, 3)
    assert isinstance(r3.upload_completion.exception(timeout=0), ckpt.CheckpointError)  # seen too
    cp.save_async(4, STATE).result(timeout=60)
    cp.wait()
    cp.close()
    assert ckpt.list_steps(root) == [1, 4]


def test_error_seen_on_staging_completion_is_not_raised_again(root, monkeypatch):
    cp = ckpt.Checkpointer(root, lazy=True)
    cp.save(1, STATE)
    os.rename(root, root + ".aside")
    r2 = cp.save_async(2, STATE)
    with pytest.raises(ckpt.CheckpointError):
        r2.result(timeout=60)
    os.rename(root + ".aside", root)
    cp.save(3, STATE)
    cp.close()
    assert ckpt.list_steps(root) == [1, 3]


@pytest.mark.parametrize("reporter", ["save_async", "wait", "close"])
def test_unseen_error_is_raised_once_by_the_next_call(root, reporter, monkeypatch):
    cp = ckpt.Checkpointer(root)
    cp.save(1, STATE)
    r2 = failed_save(cp, root, 2)
    with pytest.raises(ckpt.CheckpointError) as info:
        if reporter == "save_async":
            cp.save_async(3, STATE)
        elif reporter == "wait":
            cp.wait()
        else:
            cp.close()
    assert info.value is error_of(r2)  # the save's own error
    if reporter != "close":
        cp.wait()
        cp.save_async(3, STATE).result(timeout=60)
        cp.wait()
    cp.close()
    cp.close()
    assert ckpt.list_steps(root) == ([1] if reporter == "close" else [1, 3])


def test_unseen_errors_are_raised_one_per_call_oldest_first(root, monkeypatch):
    cp = ckpt.Checkpointer(root)
    cp.save(1, STATE)
    r2, r3 = failed_saves(cp, monkeypatch, 2, 3)
    with pytest.raises(ckpt.CheckpointError) as first:
        cp.save_async(4, STATE)
    with pytest.raises(ckpt.CheckpointError) as second:
        cp.wait()
    assert first.value is error_of(r2) and second.value is error_of(r3)
    cp.save(4, STATE)
    cp.close()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="[optional] exception notes are Python 3.11+")
def test_close_raises_the_oldest_unseen_error_and_names_the_others(root, monkeypatch):
    cp = ckpt.Checkpointer(root)
    cp.save(1, STATE)
    r2, r3, r4 = failed_saves(cp, monkeypatch, 2, 3, 4)
    r3.upload_completion.exception()  # seen: not named again
    with pytest.raises(ckpt.CheckpointError) as info:
        cp.close()
    assert info.value is error_of(r2)
    notes = getattr(info.value, "__notes__", [])
    assert len(notes) == 1 and str(error_of(r4)) in notes[0]
    cp.close()
    cp.wait()


def test_close_with_cancel_raises_an_earlier_unseen_error(root):
    cp = ckpt.Checkpointer(root)
    cp.save(1, STATE)
    r2 = failed_save(cp, root, 2)
    with pytest.raises(ckpt.CheckpointError) as info:
        cp.close(cancel=True)
    assert info.value is error_of(r2)
    cp.wait()
    cp.close()


def test_close_with_cancel_raises_no_error_of_the_saves_it_abandons(root):
    cp = ckpt.Checkpointer(root)
    state = {"w": torch.randn(16 << 20)}
    responses = [cp.save_async(step, state) for step in (1, 2, 3)]
    cp.close(cancel=True)
    cp.wait()
    done, _ = concurrent.futures.wait([r.upload_completion for r in responses], timeout=0)
    assert len(done) == 3  # each committed or was cancelled, and says so
    assert ckpt.list_steps(root) == [r.step for r in responses if r.upload_completion.exception() is None]


def test_error_the_engine_reports_before_the_waiter_is_raised_once(root, monkeypatch):
    """The engine reports a failed save's error once by itself (the next
    SaveAsync returns it) if no handle reported it yet: if the waiter thread
    had not waited for that save yet. Held waits make that certain. Two saves
    fail unseen, the first as the Checkpointer sees it only (injected), the
    second in the engine; the save_async that meets the engine's report of the
    second raises the first's error, the next save_async the second's own
    error: each once, none lost."""
    cp = ckpt.Checkpointer(root)
    cp.save(1, STATE)
    with HeldSaves(monkeypatch, fail_steps=[2], on_raise=lambda e: held.release_all()) as held:
        r2 = cp.save_async(2, STATE)
        wait_until(lambda: cp.stats()["saves_committed"] == 2, "save 2 to commit")
        os.rename(root, root + ".aside")
        r3 = cp.save_async(3, STATE)
        wait_until(lambda: cp.stats()["saves_failed"] == 1, "save 3 to fail")
        os.rename(root + ".aside", root)
        with pytest.raises(ckpt.CheckpointError) as first:
            cp.save_async(4, STATE)
        assert len(held.raised) == 1
        assert "an earlier save failed: save of step 3" in str(held.raised[0])
        with pytest.raises(ckpt.CheckpointError) as second:
            cp.save_async(4, STATE)
        assert first.value is error_of(r2), first.value
        assert second.value is error_of(r3), second.value
        cp.save_async(4, STATE).result(timeout=60)
    cp.wait()
    cp.close()
    assert ckpt.list_steps(root) == [1, 2, 4]  # (2 failed only as the Checkpointer saw it)
