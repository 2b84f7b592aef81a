"""torch.distributed.checkpoint (DCP) through ckpt: ckpt.dcp.StorageWriter,
StorageReader and import_checkpoint.

  * One process: dcp.save, dcp.async_save (thread and process checkpointer
    types, with and without DCP's staging options) and dcp.load of a GPT-style
    model + AdamW + LR scheduler + non-tensor items round-trip bit for bit;
    each save is one ckpt checkpoint that ckpt-restore lists and verifies
    and ckpt-retain keeps and tiers; a damaged record is refused on load;
    custom planners and their metadata; async_save stages into reused
    buffers; exact deltas and float compression as writer options.
  * Two ranks (gloo, FSDP2 DTensors): saved through ckpt, loaded bit for bit
    on 2 ranks, on 3 (other chunk boundaries) and on one plain process.
  * SIGKILL during a dcp.async_save through ckpt: the previous step loads,
    no partial step is visible, the next writer reclaims the debris.
  * DCP FileSystemWriter directories: test_dcp_import.py.
  * Clear errors: a checkpoint_id that names no step, a torch without DCP.
"""
import os
import signal
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

HERE = os.path.dirname(os.path.abspath(__file__))


pytestmark = pytest.mark.usefixtures("dcp_engines_closed")


def _listed(ckpt_restore, root):
    proc = subprocess.run([ckpt_restore, "--root", root, "--list", "--verify"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_save_load_round_trip_bit_identical(root, ckpt_restore):
    t, state = dw.saved_state(3)
    want = dw.fingerprint(t, state.extra)
    fresh = dw.fresh_state()
    assert dw.fingerprint(fresh.t, fresh.extra) != want  # so an equal one was loaded
    dcp.save({"app": state}, storage_writer=ckpt.dcp.StorageWriter(root), checkpoint_id=3)
    assert ckpt.list_steps(root) == [3]
    assert dw.load_fingerprint(ckpt.dcp.StorageReader(root)) == want
    assert dw.load_fingerprint(ckpt.dcp.StorageReader(root, step="step-3")) == want
    # A plain ckpt checkpoint: listed and verified by ckpt-restore, tensors by fqn.
    assert "3" in _listed(ckpt_restore, root)
    names = {x["name"] for x in ckpt.describe(root, 3)["tensors"]}
    assert "app.model.blocks.0.linear1.weight" in names
    assert "app.extra.blob" in names  # the BytesIO, as bytes


class _Rope(torch.nn.Module):
    """A RoPE table as a persistent complex64 buffer (freqs_cis; torchtitan's
    Llama registered it persistent for seed checkpoints, and Llama-style
    models still do), and a float8 tensor as FP8 training keeps them."""

    def __init__(self, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.proj = torch.nn.Linear(8, 8)
        angles = torch.outer(torch.arange(16).float(), torch.rand(4, generator=g))
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles), persistent=True)
        self.register_buffer("w8", torch.randn(8, 8, generator=g).to(torch.float8_e4m3fn))


def test_complex_and_float8_buffers_round_trip(root):
    saved, fresh = _Rope(1), _Rope(2)
    dcp.save({"model": saved.state_dict()}, storage_writer=ckpt.dcp.StorageWriter(root), checkpoint_id=1)
    into = {"model": fresh.state_dict()}
    dcp.load(into, storage_reader=ckpt.dcp.StorageReader(root))
    fresh.load_state_dict(into["model"])
    for name, want in saved.state_dict().items():
        got = fresh.state_dict()[name]
        assert got.dtype == want.dtype and torch.equal(got.view(torch.uint8), want.view(torch.uint8)), name
    dtypes = {x["name"]: x["dtype"] for x in ckpt.describe(root, 1)["tensors"]}
    assert dtypes["model.freqs_cis"] == "complex64" and dtypes["model.w8"] == "float8_e4m3fn"


def test_custom_planners_and_their_metadata(root):
    """A SavePlanner that keeps only the model and adds its own planner data,
    and a LoadPlanner that sees the metadata as saved and loads partially."""
    import dataclasses
    from torch.distributed.checkpoint import DefaultLoadPlanner, DefaultSavePlanner

    class ModelOnly(DefaultSavePlanner):
        def create_local_plan(self):
            plan = super().create_local_plan()
            return dataclasses.replace(plan, items=[i for i in plan.items
                                                    if i.index.fqn.startswith("app.model.")])

        def create_global_plan(self, plans):
            plans, metadata = super().create_global_plan(plans)
            metadata.planner_data = {"kept": "model", "fqns": sorted(metadata.state_dict_metadata)}
            return plans, metadata

    seen = {}

    class Recording(DefaultLoadPlanner):
        def set_up_planner(self, state_dict, metadata=None, is_coordinator=False):
            seen["planner_data"] = metadata.planner_data
            super().set_up_planner(state_dict, metadata, is_coordinator)

    t, state = dw.saved_state(2)
    dcp.save({"app": state}, storage_writer=ckpt.dcp.StorageWriter(root), checkpoint_id=2,
             planner=ModelOnly())
    names = {x["name"] for x in ckpt.describe(root, 2)["tensors"]}
    assert names and all(n.startswith("app.model.") for n in names), names
    fresh = dw.Trainer(7).train(1)
    target = {"model": fresh.model.state_dict()}
    dcp.load({"app": target}, storage_reader=ckpt.dcp.StorageReader(root),
             planner=Recording(allow_partial_load=True))
    assert seen["planner_data"]["kept"] == "model"
    assert seen["planner_data"]["fqns"] == sorted(names)
    for name, tensor in t.model.state_dict().items():
        assert torch.equal(target["model"][name], tensor), name


def test_damaged_record_is_refused_on_load(root):
    _, state = dw.saved_state(2)
    dcp.save({"app": state}, storage_writer=ckpt.dcp.StorageWriter(root), checkpoint_id=2)
    info = ckpt.describe(root, 2)
    big = max(info["tensors"], key=lambda x: x["raw_bytes"])  # a record inside a shard file
    shard = os.path.join(info["dir"], big["shard"])
    with open(shard, "r+b") as f:
        f.seek(big["offset"] + big["raw_bytes"] // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x40]))
    with pytest.raises(BaseException, match="DATA_LOSS"):
        dw.load_fingerprint(ckpt.dcp.StorageReader(root))


def test_steps_without_checkpoint_id_follow_the_newest(root):
    t, state = dw.saved_state(2)
    writer = ckpt.dcp.StorageWriter(root)
    dcp.save({"app": state}, storage_writer=writer, checkpoint_id=os.path.join(root, "step-40"))
    dcp.save({"app": state}, storage_writer=writer)
    dcp.save({"app": state}, storage_writer=writer)
    assert ckpt.list_steps(root) == [40, 41, 42]
    assert dw.load_fingerprint(ckpt.dcp.StorageReader(root)) == dw.fingerprint(t, state.extra)


@pytest.mark.parametrize("kind", ["THREAD", "PROCESS"])
@pytest.mark.parametrize("staging", ["default", "shared_memory"])
def test_async_save_round_trip(root, tmp_path, kind, staging):
    # (DCP's process checkpointer needs an initialized group: a gloo group of one.)
    w = workers.run_world("dcp_workers:async_round_trip", 1, str(tmp_path / "work"), timeout=240,
                          root=root, kind=kind, shared_memory=staging == "shared_memory")
    wants = w.value(0)
    assert ckpt.list_steps(root) == [2, 4]
    for step, want in wants.items():
        assert dw.load_fingerprint(ckpt.dcp.StorageReader(root, step=int(step))) == want


def test_async_save_stages_into_reused_buffers(root):
    writer = ckpt.dcp.StorageWriter(root)
    t = dw.Trainer(0)
    wants, futures = {}, {}
    for step in (1, 2, 3, 4):
        t.train(1)
        state = dw.AppState(t, dw.extra_items(step))
        futures[step] = dcp.async_save({"app": state}, storage_writer=writer, checkpoint_id=step)
        wants[step] = dw.fingerprint(t, state.extra)
        if step != 2:  # step 3 is staged while step 2 may still be written
            for f in futures.values():
                getattr(f, "upload_completion", f).result(timeout=120)
    assert writer._staging.reused >= 1  # a later save copied into a kept set
    for step, want in wants.items():
        assert dw.load_fingerprint(ckpt.dcp.StorageReader(root, step=step)) == want


@pytest.mark.parametrize("ids", ["given", "none"])
def test_overlapping_async_saves_of_one_writer_keep_their_own_steps(root, ids):
    # Each dcp.async_save runs DCP's save (reset, plans, write_data, finish)
    # on a thread of its own, on the one writer: four started before any is
    # waited for overlap, and each must write its own step with its own state
    # (before, a shared "current step" made two of them save the same one).
    writer = ckpt.dcp.StorageWriter(root)
    t = dw.Trainer(0)
    wants, futures = {}, []
    for step in (1, 2, 3, 4):
        t.train(1)
        state = dw.AppState(t, dw.extra_items(step))
        kwargs = {"checkpoint_id": step} if ids == "given" else {}
        futures.append(dcp.async_save({"app": state}, storage_writer=writer, **kwargs))
        wants[step if ids == "given" else step - 1] = dw.fingerprint(t, state.extra)
    for f in futures:
        getattr(f, "upload_completion", f).result(timeout=120)
    assert ckpt.list_steps(root) == sorted(wants)
    got = {step: dw.load_fingerprint(ckpt.dcp.StorageReader(root, step=step)) for step in wants}
    if ids == "given":
        assert got == wants
    else:  # (the threads may plan in any order: each state once, each under a step of its own)
        assert sorted(map(repr, got.values())) == sorted(map(repr, wants.values()))


def test_async_save_process_checkpointer_two_ranks(tmp_path):
    root = str(tmp_path / "ckpts")
    w = workers.run_world("dcp_workers:async_round_trip", 2, str(tmp_path / "work"), timeout=300,
                          root=root, kind="PROCESS", shared_memory=False)
    w.check()
    assert ckpt.list_steps(root) == [2, 4] and ckpt.describe(root, 4)["world_size"] == 2
    for step, want in w.value(0).items():
        assert dw.load_fingerprint(ckpt.dcp.StorageReader(root, step=int(step))) == want


def test_writer_options_deltas_and_float_compression(root):
    writer = ckpt.dcp.StorageWriter(root, delta="exact", full_every=4, compression="floats")
    t = dw.Trainer(0)
    wants = {}
    for step in (1, 2, 3):
        t.train(1)
        state = dw.AppState(t, dw.extra_items(step))
        dcp.save({"app": state}, storage_writer=writer, checkpoint_id=step)
        wants[step] = dw.fingerprint(t, state.extra)
    encodings = [{x["encoding"] for x in ckpt.describe(root, s)["tensors"] if x["raw_bytes"] > 256}
                 for s in (1, 2, 3)]
    assert "planes" in encodings[0] and not any("xor" in e for e in encodings[0]), encodings
    assert any("xor" in e for e in encodings[1]), encodings  # an exact delta of step 1
    stored = sum(x["stored_bytes"] for x in ckpt.describe(root, 1)["tensors"])
    raw = sum(x["raw_bytes"] for x in ckpt.describe(root, 1)["tensors"])
    assert stored < 0.9 * raw, (stored, raw)  # floats compression of the full save
    for step, want in wants.items():
        assert dw.load_fingerprint(ckpt.dcp.StorageReader(root, step=step)) == want


@pytest.fixture
def ckpt_retain(ckpt_restore):
    path = os.path.join(os.path.dirname(ckpt_restore), "ckpt-retain")
    if not os.path.exists(path):
        pytest.skip("ckpt-retain not built")
    return path


def test_retention_keeps_and_tiers_dcp_steps(root, tmp_path, ckpt_retain, ckpt_restore):
    writer = ckpt.dcp.StorageWriter(root, delta="exact", full_every=3)
    t = dw.Trainer(0)
    wants = {}
    for step in range(1, 6):
        t.train(1)
        state = dw.AppState(t, dw.extra_items(step))
        dcp.save({"app": state}, storage_writer=writer, checkpoint_id=step)
        wants[step] = dw.fingerprint(t, state.extra)
    ckpt.dcp.close_all()
    cold = str(tmp_path / "cold")
    os.makedirs(cold)
    proc = subprocess.run([ckpt_retain, "--root", root, "--keep-last", "2", "--cold-dir", cold],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kept = ckpt.list_steps(root)
    assert kept[-2:] == [4, 5] and 1 not in kept or kept == [4, 5], kept
    _listed(ckpt_restore, root)
    for step in (4, 5):  # the kept ones, deltas included, load as saved
        assert dw.load_fingerprint(ckpt.dcp.StorageReader(root, step=step)) == wants[step]
    moved = ckpt.list_steps(cold)
    assert 1 in moved, moved
    assert dw.load_fingerprint(ckpt.dcp.StorageReader(cold, step=1)) == wants[1]  # the cold tier is a root too


def test_checkpoint_id_that_names_no_step_is_refused(root):
    _, state = dw.saved_state(1)
    writer = ckpt.dcp.StorageWriter(root)
    for bad in ("latest", "/elsewhere/step-5", -1):
        with pytest.raises(ckpt.dcp.DcpError, match="checkpoint_id"):
            dcp.save({"app": state}, storage_writer=writer, checkpoint_id=bad)
    assert not os.path.exists(os.path.join(root, "step-00000000000005"))


def test_torch_without_dcp_is_named():
    code = textwrap.dedent("""
        import sys
        sys.modules["torch.distributed.checkpoint"] = None  # as a torch without DCP
        import ckpt
        try:
            import ckpt.dcp
        except ckpt.CheckpointError as e:
            print("REFUSED", e)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)
    assert "REFUSED" in proc.stdout and "torch.distributed.checkpoint" in proc.stdout, \
        proc.stdout + proc.stderr
    assert torch.__version__ in proc.stdout


# -- two ranks ------------------------------------------------------------------

@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    base = tmp_path_factory.mktemp("dcp2")
    root, work = str(base / "ckpts"), str(base / "work")
    w = workers.run_world("dcp_workers:save_sharded", 2, work, timeout=240, root=root,
                          writer_options={}, async_type="THREAD")
    w.check()
    return root, work, w.value(0)


def test_two_ranks_save_one_checkpoint(sharded):
    root, _, _ = sharded
    assert ckpt.list_steps(root) == [3, 5]
    info = ckpt.describe(root, 3)
    assert info["world_size"] == 2
    by_name = {t["name"]: t for t in info["tensors"]}
    w = by_name["app.model.blocks.0.linear1.weight"]
    assert w["placement"] == "sharded" and len(w["chunks"]) == 2  # FSDP2's Shard(0), one per rank
    ckpt.verify(root, 5)


@pytest.mark.parametrize("world", [2, 3])
def test_two_rank_save_loads_on_other_world_sizes(sharded, world):
    root, work, saved = sharded
    w = workers.run_world("dcp_workers:load_sharded", world, work, timeout=240, root=root, step=5)
    w.check()
    for r in range(world):
        assert w.value(r) == saved["5"], f"rank {r} of {world}"


def test_two_rank_save_loads_on_one_plain_process(sharded):
    root, _, saved = sharded
    assert dw.load_fingerprint(ckpt.dcp.StorageReader(root, step=3)) == saved["3"]
    assert dw.load_fingerprint(ckpt.dcp.StorageReader(root)) == saved["5"]


# -- crash during async_save -------------------------------------------------------

_KILLED_WRITER = textwrap.dedent("""
    import os, sys, threading, time
    import torch, torch.distributed.checkpoint as dcp
    sys.path.insert(0, {here!r})
    import dcp_workers as dw, ckpt.dcp
    root = {root!r}
    t = dw.Trainer(0).train(2)
    writer = ckpt.dcp.StorageWriter(root)
    dcp.save({{"app": dw.AppState(t, dw.extra_items(2))}}, storage_writer=writer, checkpoint_id=2)
    big = {{"big.%d" % i: torch.randn(1 << 20) for i in range(48)}}  # 192 MiB
    def kill_when_writing():
        while not [n for n in os.listdir(root) if n.startswith(".tmp-")]:
            time.sleep(0.001)
        print("WRITING", flush=True)
        os.kill(os.getpid(), 9)
    threading.Thread(target=kill_when_writing, daemon=True).start()
    t.train(1)
    state = {{"app": dw.AppState(t, dw.extra_items(3)), **big}}
    f = dcp.async_save(state, storage_writer=writer, checkpoint_id=3)
    f.result()
    print("FINISHED", flush=True)
""")


def test_sigkill_during_async_save_keeps_previous_step(root, tmp_path):
    code = _KILLED_WRITER.format(here=HERE, root=root)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == -signal.SIGKILL and "WRITING" in proc.stdout, \
        proc.stdout + proc.stderr
    assert ckpt.list_steps(root) == [2]
    names = os.listdir(root)
    assert not [n for n in names if n.startswith("step-") and not n.endswith("2")], names
    assert [n for n in names if n.startswith(".tmp-")], names  # the debris of step 3
    want_t, want = dw.saved_state(2)
    assert dw.load_fingerprint(ckpt.dcp.StorageReader(root)) == dw.fingerprint(want_t, want.extra)
    # The next writer reclaims the debris and saves step 3.
    t, state = dw.saved_state(3)
    dcp.save({"app": state}, storage_writer=ckpt.dcp.StorageWriter(root), checkpoint_id=3)
    assert not [n for n in os.listdir(root) if n.startswith(".tmp-")], os.listdir(root)
    assert dw.load_fingerprint(ckpt.dcp.StorageReader(root)) == dw.fingerprint(t, state.extra)
