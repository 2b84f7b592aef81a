"""Directories written by DCP's own FileSystemWriter, through ckpt.dcp
(the save/load side is test_dcp.py).

  * Checkpoints of one process and of two ranks (FSDP2, gloo) imported with
    ckpt.dcp.import_checkpoint and with ckpt-restore --import-dcp, verified,
    and loaded bit for bit through ckpt.dcp.StorageReader; read in place too.
  * The import streams: a 512 MiB checkpoint through 16 MiB of staging grows
    the process's anonymous memory by less than 128 MiB.
  * A truncated data file or a missing .metadata is refused naming the cause;
    a .metadata pickle that would run code is refused and runs nothing; a
    garbled one is a CorruptCheckpointError.
"""
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch

import ckpt

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)
dcp = pytest.importorskip("torch.distributed.checkpoint")

import ckpt.dcp  # noqa: E402
import dcp_workers as dw  # noqa: E402
import distributed_workers as workers  # noqa: E402


pytestmark = pytest.mark.usefixtures("dcp_engines_closed")


# -- DCP FileSystemWriter directories ------------------------------------------------

@pytest.fixture(scope="module")
def dcp_dirs(tmp_path_factory):
    """DCP's own checkpoints: one written by one process, one by two ranks."""
    base = tmp_path_factory.mktemp("dcpfs")
    one, two = str(base / "one"), str(base / "two")
    t, state = dw.saved_state(3)
    dcp.save({"app": state}, storage_writer=dcp.FileSystemWriter(one))
    fp_one = dw.fingerprint(t, state.extra)
    w = workers.run_world("dcp_workers:save_with_dcp_fs", 2, str(base / "work"), timeout=240,
                          dcp_dir=two)
    w.check()
    return {"one": (one, fp_one), "two": (two, w.value(0))}


@pytest.mark.parametrize("which", ["one", "two"])
def test_import_dcp_checkpoint_loads_bit_identically(dcp_dirs, root, which):
    path, want = dcp_dirs[which]
    stats = ckpt.dcp.import_checkpoint(path, root, 1000, staging_bytes=64 << 10,
                                       chunk_bytes=16 << 10)
    assert stats["tensor_bytes"] > 4 * (64 << 10)  # more than the staging pool: streamed
    assert ckpt.list_steps(root) == [1000]
    ckpt.verify(root, 1000)
    assert dw.load_fingerprint(ckpt.dcp.StorageReader(root)) == want


_STREAMED_IMPORT = textwrap.dedent("""
    import threading, time
    import torch, torch.distributed.checkpoint as dcp
    import ckpt.dcp
    def anon_mib():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) >> 10
    state = {{"w%d" % i: torch.full((4 << 20,), float(i)) for i in range(32)}}  # 512 MiB
    dcp.save(state, storage_writer=dcp.FileSystemWriter({src!r}))
    del state
    base = anon_mib()
    peak, stop = [base], []
    def sample():
        while not stop:
            peak[0] = max(peak[0], anon_mib())
            time.sleep(0.002)
    sampler = threading.Thread(target=sample)
    sampler.start()
    stats = ckpt.dcp.import_checkpoint({src!r}, {root!r}, 1, staging_bytes=16 << 20)
    stop.append(1)
    sampler.join()
    print("GROWTH_MIB", peak[0] - base, stats["tensor_bytes"] >> 20)
""")


def test_import_streams_through_bounded_memory(tmp_path, root):
    code = _STREAMED_IMPORT.format(src=str(tmp_path / "dcp"), root=root)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    growth, mib = map(int, proc.stdout.split("GROWTH_MIB")[1].split())
    assert mib == 512 and growth < 128, proc.stdout  # 16 MiB staging, not the 512 MiB state
    got = {f"w{i}": torch.empty(4 << 20) for i in range(32)}
    dcp.load(got, storage_reader=ckpt.dcp.StorageReader(root))
    for i in range(32):
        assert torch.equal(got[f"w{i}"], torch.full((4 << 20,), float(i))), i


@pytest.mark.parametrize("which", ["one", "two"])
def test_dcp_directory_reads_in_place(dcp_dirs, which):
    path, want = dcp_dirs[which]
    assert dw.load_fingerprint(ckpt.dcp.StorageReader(path)) == want


def test_import_with_ckpt_restore(dcp_dirs, root, ckpt_restore):
    path, want = dcp_dirs["two"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), CKPT_PYTHON=sys.executable)
    proc = subprocess.run([ckpt_restore, "--root", root, "--import-dcp", path, "--step", "7"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ckpt.list_steps(root) == [7]
    assert dw.load_fingerprint(ckpt.dcp.StorageReader(root)) == want
    # Without --step: a usage error; a directory that is no DCP checkpoint: refused (1).
    usage = subprocess.run([ckpt_restore, "--root", root, "--import-dcp", path],
                           capture_output=True, text=True, timeout=60, env=env)
    assert usage.returncode == 2 and "--import-dcp needs --root DIR and --step N" in usage.stderr
    refused = subprocess.run([ckpt_restore, "--root", root, "--import-dcp", root, "--step", "8"],
                             capture_output=True, text=True, timeout=300, env=env)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "has no .metadata" in refused.stderr and "was not imported" in refused.stderr
    assert ckpt.list_steps(root) == [7]


def _copy(src, dst):
    import shutil
    shutil.copytree(src, dst)
    return dst


def test_truncated_dcp_directory_is_refused(dcp_dirs, root, tmp_path):
    path = _copy(dcp_dirs["two"][0], str(tmp_path / "cut"))
    data = sorted(n for n in os.listdir(path) if n.endswith(".distcp"))[-1]
    size = os.path.getsize(os.path.join(path, data))
    os.truncate(os.path.join(path, data), size // 2)
    with pytest.raises(ckpt.dcp.DcpError, match=f"incomplete: {data} has {size // 2} bytes"):
        ckpt.dcp.import_checkpoint(path, root, 1)
    with pytest.raises(BaseException, match="truncated"):
        dw.load_fingerprint(ckpt.dcp.StorageReader(path))
    assert not os.path.exists(root) or ckpt.list_steps(root) == []
    os.remove(os.path.join(path, ".metadata"))
    with pytest.raises(ckpt.dcp.DcpError, match="has no .metadata"):
        ckpt.dcp.import_checkpoint(path, root, 1)


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_metadata_that_would_run_code_is_refused(dcp_dirs, root, tmp_path, monkeypatch):
    path = _copy(dcp_dirs["one"][0], str(tmp_path / "evil"))
    with open(os.path.join(path, ".metadata"), "rb") as f:
        good = f.read()
    ckpt.dcp.load_metadata(good, "good")  # plain metadata passes
    with open(os.path.join(path, ".metadata"), "wb") as f:
        pickle.dump({"metadata": _Payload()}, f)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ckpt.dcp.UnsafeMetadataError, match="posix.system|os.system"):
        ckpt.dcp.import_checkpoint(path, root, 1)
    with pytest.raises(BaseException, match="posix.system|os.system"):
        dw.load_fingerprint(ckpt.dcp.StorageReader(path))
    assert not os.path.exists(tmp_path / "PWNED")
    # Garbled metadata: a clear error too.
    with open(os.path.join(path, ".metadata"), "wb") as f:
        f.write(good[: len(good) // 2])
    with pytest.raises(ckpt.CorruptCheckpointError, match="not a readable DCP metadata"):
        ckpt.dcp.import_checkpoint(path, root, 1)
