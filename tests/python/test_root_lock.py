"""One writer per root, from Python: a second Checkpointer on the same root
fails at once (in this process or from another), naming the root and the
holder; closing, or the holder's death (SIGKILL), frees the root at once."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

import ckpt

HOLDER = textwrap.dedent("""
    import sys, time, torch, ckpt
    with ckpt.Checkpointer(sys.argv[1]) as cp:
        cp.save(1, {"w": torch.ones(1000)})
        print("ready", flush=True)
        time.sleep(600)
""")


def test_a_second_checkpointer_fails_naming_the_root_and_holder(root):
    state = {"w": torch.randn(1000), "step": 1}
    with ckpt.Checkpointer(root) as first:
        with pytest.raises(ckpt.CheckpointError) as info:
            ckpt.Checkpointer(root)
        assert info.value.code == "UNAVAILABLE"
        assert root in str(info.value)
        assert f"pid {os.getpid()}" in str(info.value)
        first.save(1, state)  # the first writer is unharmed
    with ckpt.Checkpointer(root) as again:  # closed: the root is free
        again.save(2, state)
    assert torch.equal(ckpt.load(root)["w"], state["w"])


def test_a_killed_writer_process_frees_the_root_at_once(root):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, root], stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        line = proc.stdout.readline()  # the holder saved and holds the root
        assert line.strip() == "ready", f"holder exited {proc.poll()}"
        with pytest.raises(ckpt.CheckpointError, match=f"pid {proc.pid}"):
            ckpt.Checkpointer(root)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    with ckpt.Checkpointer(root) as cp:
        cp.save(2, {"w": torch.zeros(1000)})
    assert ckpt.load(root, step=1)["w"].sum().item() == 1000
