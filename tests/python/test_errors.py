"""The exception class comes from the library's status code itself, never from
the message text (which holds roots and paths that may look like codes)."""
import os
import shutil

import numpy
import pytest
import torch

import ckpt
from ckpt import errors
from test_load import corrupt


@pytest.mark.parametrize("name", ["RUN_A", "DATA_LOSS: y", "ALREADY_EXISTS: z"])
def test_missing_root_is_not_found_whatever_its_name(tmp_path, name):
    root = str(tmp_path / name)
    for call in (lambda: ckpt.load(root), lambda: ckpt.load(root, step=3),
                 lambda: ckpt.describe(root), lambda: ckpt.verify(root, 1)):
        with pytest.raises(ckpt.CheckpointNotFoundError) as info:
            call()
        assert info.value.code == "NOT_FOUND" and isinstance(info.value, FileNotFoundError)
        assert root in str(info.value)


def test_corrupt_checkpoint_in_a_root_named_like_a_code(tmp_path):
    root = str(tmp_path / "NOT_FOUND: x" / "RUN_A")
    os.makedirs(os.path.dirname(root))
    with ckpt.Checkpointer(root) as cp:
        cp.save(1, {"w": torch.ones(1000)})
    corrupt(root, 1)
    with pytest.raises(ckpt.CorruptCheckpointError) as info:
        ckpt.load(root, step=1)
    assert info.value.code == "DATA_LOSS"
    with pytest.raises(ckpt.CorruptCheckpointError):
        ckpt.verify(root, 1)
    with pytest.raises(ckpt.CheckpointNotFoundError) as info:  # nothing intact to fall back to
        ckpt.load(root, into={"w": torch.zeros(1000)})
    assert info.value.code == "NOT_FOUND"


def test_other_codes_give_a_checkpoint_error_with_the_code(tmp_path):
    root = str(tmp_path / "DATA_LOSS: y")
    with ckpt.Checkpointer(root) as cp:
        cp.save(1, {"w": torch.ones(1)})
        with pytest.raises(ckpt.CheckpointError) as info:
            cp.save_async(1, {"w": torch.ones(1)})  # step 1 exists
    assert type(info.value) is ckpt.CheckpointError and info.value.code == "ALREADY_EXISTS"


def test_background_errors_carry_their_code(tmp_path):
    root = str(tmp_path / "NOT_FOUND: q")
    cp = ckpt.Checkpointer(root)
    cp.save(1, {"a": torch.ones(1)})
    shutil.rmtree(root)  # the save's temp directory cannot be created (in the watcher thread)
    resp = cp.save_async(2, {"a": torch.ones(1)})
    with pytest.raises(ckpt.CheckpointError) as info:
        resp.result()
    assert info.value.code is not None and info.value.code != "DATA_LOSS"
    os.makedirs(root)
    cp.close()


def test_runtime_errors_not_raised_by_the_library_have_no_code(root):
    with pytest.raises(ckpt.CheckpointError) as info:
        with errors.translate():
            raise RuntimeError("ckpt: load from /r: NOT_FOUND: looks like the library's")
    assert type(info.value) is ckpt.CheckpointError and info.value.code is None
    # A library error nobody translated leaves its record; it is not taken for
    # a later, different error.
    with pytest.raises(RuntimeError):
        torch.ops.ckpt.describe(root, None)
    with pytest.raises(ckpt.CheckpointError) as info:
        with errors.translate():
            raise RuntimeError("something else")
    assert info.value.code is None
    assert torch.ops.ckpt.last_error() == ("", "")  # taken, and cleared


def test_last_error_records_the_code_on_the_throwing_thread(root):
    with pytest.raises(RuntimeError) as info:
        torch.ops.ckpt.describe(root, None)
    code, message = torch.ops.ckpt.last_error()
    assert code == "NOT_FOUND" and message in str(info.value)
    assert torch.ops.ckpt.last_error() == ("", "")


@pytest.mark.parametrize("step", [1.5, 2.0, True, "3", None], ids=repr)
def test_a_step_that_is_not_an_integer_is_refused(root, step):
    # int(1.5) would have saved it as step 1, and True as step 1.
    with ckpt.Checkpointer(root) as cp:
        with pytest.raises(TypeError, match="a step is an integer"):
            cp.save_async(step, {"w": torch.ones(2)})
        cp.save(numpy.int64(4), {"w": torch.ones(2)})  # integral types still are steps
        cp.save(torch.tensor(5), {"w": torch.zeros(2)})
    assert ckpt.list_steps(root) == [4, 5]
    if step is not None:
        with pytest.raises(TypeError, match="a step is an integer"):
            ckpt.load(root, step=step)
        with pytest.raises(TypeError, match="a step is an integer"):
            ckpt.verify(root, step)
    assert torch.equal(ckpt.load(root, step=numpy.int32(4))["w"], torch.ones(2))
