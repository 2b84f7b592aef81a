"""ckpt.load picks the newest checkpoint that reads back intact."""
import glob
import os
import subprocess

import pytest
import torch

import ckpt


def save_steps(root, steps):
    states = {}
    with ckpt.Checkpointer(root) as cp:
        for s in steps:
            states[s] = {"w": torch.full((1000,), float(s)), "step": s}
            cp.save_async(s, states[s])
    return states


def corrupt(root, step):
    """Flips one byte of the first tensor record of checkpoint `step`."""
    shards = sorted(glob.glob(os.path.join(root, f"step-*{step:014d}", "*.shard")))
    assert shards, os.listdir(root)
    with open(shards[0], "r+b") as f:
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 0xFF]))


def test_newest_by_default(root):
    save_steps(root, [1, 2, 3])
    step, state = ckpt.load(root, with_step=True)
    assert step == 3 and state["step"] == 3


def test_corrupt_newest_is_skipped_with_a_warning(root, ckpt_restore):
    save_steps(root, [1, 2, 3])
    corrupt(root, 3)
    with pytest.warns(ckpt.SkippedCheckpointWarning, match=r"step 3: DATA_LOSS: .*checksum"):
        step, state = ckpt.load(root, with_step=True)
    assert step == 2 and state["step"] == 2 and torch.equal(state["w"], torch.full((1000,), 2.0))
    into = {"w": torch.zeros(1000), "step": 0}
    with pytest.warns(ckpt.SkippedCheckpointWarning, match="step 3"):
        got = ckpt.load(root, into=into)
    assert got["w"] is into["w"] and torch.equal(into["w"], torch.full((1000,), 2.0))
    with pytest.raises(ckpt.CorruptCheckpointError, match="checksum"):
        ckpt.load(root, step=3)
    with pytest.raises(ckpt.CorruptCheckpointError):
        ckpt.verify(root, 3)
    ckpt.verify(root, 2)
    # The operator's tool agrees.
    out = subprocess.run([ckpt_restore, "--root", root, "--latest", "--verify"], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert "step 2" in out.stdout and "skipped step 3" in out.stderr


def test_nothing_to_load(root, tmp_path):
    os.makedirs(root)
    with pytest.raises(ckpt.CheckpointNotFoundError, match="no committed checkpoint"):
        ckpt.load(root)
    with pytest.raises(FileNotFoundError):
        ckpt.load(root, into={})
    save_steps(root, [1])
    corrupt(root, 1)
    with pytest.raises(ckpt.CheckpointNotFoundError,
                       match=r"no checkpoint reads back intact \(step 1: DATA_LOSS"):
        ckpt.load(root)
    with pytest.raises(ckpt.CheckpointNotFoundError):
        ckpt.load(root, step=7)
