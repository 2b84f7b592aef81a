"""torch.ops.ckpt / torch.classes.ckpt used directly, without the Python package."""
import json
import os
import shutil
import threading
import time

import pytest
import torch

import ckpt  # loads the extension

SAVE_ASYNC_SCHEMA = (
    "ckpt::save_async(__torch__.torch.classes.ckpt.Engine engine, int step, str[] names, "
    "Tensor[] tensors, str extras_json=\"{}\", int[] placements=[], int[][]? global_shapes=None, "
    "int[][]? global_offsets=None) -> __torch__.torch.classes.ckpt.SaveHandle")


def test_schemas():
    assert str(torch.ops.ckpt.save_async.default._schema) == SAVE_ASYNC_SCHEMA
    assert str(torch.ops.ckpt.read.default._schema) == \
        "ckpt::read(str root, int? step=None, int? rank=None) -> (int, str[], Tensor[], str, str[])"
    assert str(torch.ops.ckpt.list_steps.default._schema) == "ckpt::list_steps(str root) -> int[]"
    assert str(torch.ops.ckpt.read_regions.default._schema) == \
        ("ckpt::read_regions(str root, int step, str[] names, int[][] offsets, Tensor[](a!) tensors, "
         "int? rank=None) -> int")


def test_save_and_read_with_ops(root):
    engine = torch.classes.ckpt.Engine(root, json.dumps({"delta": "exact"}))
    a = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    h = torch.ops.ckpt.save_async(engine, 5, ["m.a", "m.b"], [a, a.t()], '{"epoch": 3}')
    h.wait_staged()
    a.zero_()
    h.wait()
    assert h.done() and not h.skipped() and h.step() == 5
    stats = json.loads(h.stats_json())
    assert stats["tensor_count"] == 2 and stats["tensor_bytes"] == 96
    engine.close(False)
    step, names, tensors, extras, skipped = torch.ops.ckpt.read(root, None)
    assert (step, names, json.loads(extras), skipped) == (5, ["m.a", "m.b"], {"epoch": 3}, [])
    want = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert torch.equal(tensors[0], want) and torch.equal(tensors[1], want.t())
    assert torch.ops.ckpt.list_steps(root) == [5]
    torch.ops.ckpt.verify(root, 5)
    # read_into: a strided destination is filled through a temporary.
    dst = torch.empty(8, 3)[::2]
    step, extras, skipped = torch.ops.ckpt.read_into(root, 5, ["m.a"], [dst.t()])
    assert step == 5 and torch.equal(dst.t(), want)


def test_schema_is_checked(root):
    engine = torch.classes.ckpt.Engine(root)
    with pytest.raises((RuntimeError, TypeError)):
        torch.ops.ckpt.save_async(engine, "seven", ["a"], [torch.ones(1)], "{}")
    with pytest.raises((RuntimeError, TypeError)):
        torch.ops.ckpt.save_async(engine, 7, [1], [torch.ones(1)], "{}")
    with pytest.raises((RuntimeError, TypeError)):
        torch.ops.ckpt.save_async(engine, 7, ["a"], [[1.0]], "{}")
    with pytest.raises((RuntimeError, TypeError)):
        torch.ops.ckpt.save_async("not an engine", 7, ["a"], [torch.ones(1)], "{}")
    assert torch.ops.ckpt.list_steps(root) == []


@pytest.mark.parametrize("names,tensors,extras,exc,message", [
    (["a", "a"], [torch.ones(1), torch.ones(1)], "{}", ValueError, "given twice"),
    ([""], [torch.ones(1)], "{}", ValueError, "INVALID_ARGUMENT"),
    (["a"], [torch.ones(1), torch.ones(2)], "{}", ValueError, "1 names but 2 tensors"),
    (["a"], [torch.ones(1)], "[1, 2]", ValueError, "extras"),
    (["a"], [torch.ones(1)], "{not json", ValueError, "extras"),
    (["a"], [torch.ones(2, dtype=torch.complex32)], "{}", TypeError, "ComplexHalf"),
])
def test_invalid_saves_raise_with_the_library_message(root, names, tensors, extras, exc, message):
    engine = torch.classes.ckpt.Engine(root)
    with pytest.raises(exc) as info:
        torch.ops.ckpt.save_async(engine, 1, names, tensors, extras)
    assert message.lower() in str(info.value).lower()
    assert "Exception raised from" not in str(info.value)
    assert torch.ops.ckpt.list_steps(root) == []  # nothing was written


def test_existing_step_is_refused(root):
    engine = torch.classes.ckpt.Engine(root)
    torch.ops.ckpt.save_async(engine, 1, ["a"], [torch.ones(1)]).wait()
    with pytest.raises(RuntimeError, match="ALREADY_EXISTS: .*step 1 already exists"):
        torch.ops.ckpt.save_async(engine, 1, ["a"], [torch.ones(1)])
    with pytest.raises(ValueError, match="INVALID_ARGUMENT"):
        torch.ops.ckpt.save_async(engine, -3, ["a"], [torch.ones(1)])


def test_engine_options_are_checked(root, tmp_path):
    with pytest.raises(ValueError, match='unknown engine option "delt"'):
        torch.classes.ckpt.Engine(root, '{"delt": "exact"}')
    with pytest.raises(ValueError, match='"delta" is "fast"'):
        torch.classes.ckpt.Engine(root, '{"delta": "fast"}')
    with pytest.raises(ValueError, match="lazy"):
        torch.classes.ckpt.Engine(root, '{"lazy": "yes"}')
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(RuntimeError, match=str(a_file)):
        torch.classes.ckpt.Engine(str(a_file), "{}")
    with pytest.raises(ValueError):
        ckpt.Checkpointer(root, delta="sometimes")


def test_background_error_surfaces_as_exception(root):
    """A save that fails after save_async returned raises from wait() with the
    library's message; through the package, from result() or the next save."""
    engine = torch.classes.ckpt.Engine(root)
    torch.ops.ckpt.save_async(engine, 1, ["a"], [torch.ones(1)]).wait()
    shutil.rmtree(root)  # the next save cannot create its temp directory
    h = torch.ops.ckpt.save_async(engine, 2, ["a"], [torch.ones(1)])
    with pytest.raises(RuntimeError, match=r"save of step 2 .*No such file or directory"):
        h.wait()
    os.makedirs(root)

    cp = ckpt.Checkpointer(root)
    cp.save(1, {"a": torch.ones(1)})
    shutil.rmtree(root)
    resp = cp.save_async(2, {"a": torch.ones(1)})
    with pytest.raises(ckpt.CheckpointError, match="save of step 2"):
        resp.result()
    os.makedirs(root)
    cp.save(3, {"a": torch.ones(1)})  # seen by result(): not raised again
    shutil.rmtree(root)
    resp = cp.save_async(4, {"a": torch.ones(1)})
    concurrent_wait(resp)
    os.makedirs(root)
    with pytest.raises(ckpt.CheckpointError, match="save of step 4"):
        cp.save_async(5, {"a": torch.ones(1)})  # nobody saw it: raised here
    cp.save(6, {"a": torch.ones(1)})
    cp.close()
    assert ckpt.list_steps(root) == [6]


def concurrent_wait(resp):
    import concurrent.futures
    concurrent.futures.wait([resp.upload_completion])


def test_handle_wait_releases_the_gil(root):
    engine = torch.classes.ckpt.Engine(root)
    x = torch.randn(128 << 18)  # 128 MiB
    torch.ops.ckpt.save_async(engine, 1, ["x"], [x]).wait()  # warm the staging pool
    counter = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            counter[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    h = torch.ops.ckpt.save_async(engine, 2, ["x"], [x])
    before, start = counter[0], time.perf_counter()
    h.wait()
    waited, spins = time.perf_counter() - start, counter[0] - before
    stop.set()
    t.join()
    if waited < 0.01:
        pytest.skip(f"the save committed too fast ({waited:.4f} s) to tell")
    assert spins > 100, f"{spins} iterations ran during a {waited:.3f} s wait"


def test_version_is_the_one_cmake_declares():
    # CMakeLists.txt's project() is the one place the version is written.
    import os
    import re
    top = os.path.join(os.path.dirname(__file__), "..", "..", "CMakeLists.txt")
    with open(top) as f:
        declared = re.search(r"project\(ckpt VERSION ([0-9.]+)", f.read()).group(1)
    assert ckpt.__version__ == declared == torch.ops.ckpt.version()
