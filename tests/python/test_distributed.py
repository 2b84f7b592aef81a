"""Multi-rank checkpoints on torch.distributed (gloo on CPU, ranks spawned here).

The ranks run the scenarios of distributed_workers.py, forked from one
forkserver with torch and ckpt imported, each group fresh over TCP (rank 0
hosts the store). Every world has a deadline and its ranks are killed when it
passes. What is checked:
  * 2 ranks, DDP-style (model + AdamW replicated, RNG rank-local), exact
    deltas between full saves after real training steps: every step loads
    back bit-exact on every rank with the group, without a group by rank and
    all ranks at once; replicated tensors are stored once (file sizes);
    ckpt-restore verifies the checkpoints as units.
  * 4 ranks, FSDP-style (each rank its own shard: same name rank-local, or
    a name of its own), top-k deltas: exact while within the budget, within
    the recorded error bound after a dense change.
  * a rank whose save raises, ranks saving different steps, conflicting
    default-placement tensors: an error on every rank within the commit
    timeout, nothing committed, the checkpointer usable afterwards.
  * a rank SIGKILLed mid-save (rank 1; rank 0, which hosts the store): the
    survivor's error names it within the timeout, the previous checkpoint
    stays the newest and verifies, a restarted group resumes and saves.
  * load with a group picks the same step on every rank when one rank's part
    of the newest step is damaged, and raises the same error on every rank
    when there is none.
The c10d store adapter is tested against real stores first.
"""
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest
import torch

import ckpt
from ckpt import _distributed

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import distributed_workers as workers  # noqa: E402

OK_TIMEOUT = 60.0  # commit_timeout_s where every rank is healthy (a loaded 2-core VM)
FAIL_TIMEOUT = 5.0  # commit_timeout_s where a rank fails


def _restore(ckpt_restore, *args):
    return subprocess.run([ckpt_restore, *args], capture_output=True, text=True, timeout=120)


def _mentions_rank(message, rank):
    return re.search(rf"\brank[ s]*{rank}\b", message) is not None


# -- the c10d store adapter ----------------------------------------------------

def _group_over(store):
    """A ProcessGroup of one rank over `store`, as the ops take it."""
    return dist.ProcessGroup(store, 0, 1).boxed()


def test_store_adapter_set_get_set_if_absent():
    store = dist.HashStore()
    pg = _group_over(dist.PrefixStore("p/", store))
    op = torch.ops.ckpt._store_op
    assert op(pg, "set", "k", "v1") == ("", "")
    assert op(pg, "get", "k") == ("", "v1")
    assert op(pg, "set_if_absent", "k", "v2") == ("", "v1")  # held: not replaced
    assert op(pg, "set_if_absent", "n", "v3") == ("", "v3")  # absent: set
    assert op(pg, "get", "n") == ("", "v3")
    # An empty value is a value: SetIfAbsent does not replace it.
    assert op(pg, "set", "e", "") == ("", "")
    assert op(pg, "set_if_absent", "e", "x") == ("", "")
    assert op(pg, "get", "e") == ("", "")
    assert op(pg, "set", "bin", "a\x00b\xff") == ("", "")
    assert op(pg, "get", "bin") == ("", "a\x00b\xff")


def test_store_adapter_timeout_is_deadline_exceeded():
    for store in (dist.HashStore(), dist.FileStore(os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                                f"ckpt-fs-{os.getpid()}"), 1)):
        start = time.monotonic()
        code, message = torch.ops.ckpt._store_op(_group_over(store), "get", "never/set", "", 0.3)
        assert code == "DEADLINE_EXCEEDED", message
        assert "never/set" in message and time.monotonic() - start < 10


def test_store_adapter_dead_tcp_store_is_unavailable():
    """The process hosting the TCPStore (rank 0 in a job) dies while a wait is
    pending: the wait ends at once as UNAVAILABLE, naming the key."""
    server = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time, torch.distributed as d\n"
         "s = d.TCPStore('127.0.0.1', 0, 1, True, wait_for_workers=False)\n"
         "print(s.port, flush=True)\n"
         "time.sleep(120)\n"], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        import datetime
        client = dist.TCPStore("127.0.0.1", port, 1, False, timeout=datetime.timedelta(seconds=5))
        pg = _group_over(client)
        assert torch.ops.ckpt._store_op(pg, "set", "a", "1") == ("", "")
        out = {}
        waiting = threading.Event()

        def wait():
            start = time.monotonic()
            waiting.set()
            out["result"] = torch.ops.ckpt._store_op(pg, "get", "never", "", 60.0)
            out["ended"] = time.monotonic()
            out["elapsed"] = out["ended"] - start

        t = threading.Thread(target=wait)
        t.start()
        assert waiting.wait(30), "the waiting thread never started"
        killed = time.monotonic()
        server.kill()
        t.join(30)
        assert not t.is_alive(), "the wait did not end when the store died"
        code, message = out["result"]
        assert code == "UNAVAILABLE", message
        # The wait was under way when the store died, and the death ended it
        # (within the store client's 5 s timeout, far before the 60 s asked).
        assert out["ended"] >= killed, "the wait ended before the store died"
        assert "never" in message and out["elapsed"] < 15
    finally:
        server.kill()
        server.wait()


# -- options and single-process paths ----------------------------------------------

def test_placements_select_by_prefix_and_callable():
    p = _distributed.Placements(["model", "optim.state."], ["rng"])
    assert p.of(["model.fc.weight", "model2.w", "optim.state.0.exp_avg", "optim.param_groups",
                 "rng", "rng~1", "step"]) == [1, 0, 1, 0, 2, 2, 0]
    assert _distributed.Placements(None, None).of(["a"]) == []
    assert _distributed.Placements(True, None).of(["a", "b"]) == [1, 1]
    assert _distributed.Placements(lambda n: n.endswith("w"), "x").of(["a.w", "x.y", "z"]) == [1, 2, 0]
    with pytest.raises(ValueError, match="'model.w' is selected both"):
        _distributed.Placements(["model"], lambda n: "w" in n).of(["model.w"])
    with pytest.raises(ValueError, match="replicated or rank-local"):
        _distributed.Placements(True, True)
    with pytest.raises(TypeError, match="rank_local"):
        _distributed.Placements(None, 3)
    with pytest.raises(TypeError, match="prefixes are non-empty strings"):
        _distributed.Placements([""], None)


def test_single_process_without_a_group(root):
    """No initialized group (or process_group=False): a single-process
    checkpointer, as before; placements are checked but change nothing."""
    assert not dist.is_initialized()
    with ckpt.Checkpointer(root, replicated=["model"], rank_local=["rng"]) as cp:
        assert (cp.rank, cp.world_size, cp.process_group) == (0, 1, None)
        cp.save(1, {"model": {"w": torch.ones(3)}, "rng": torch.zeros(2)})
    assert ckpt.describe(root, 1)["world_size"] == 1
    assert torch.equal(ckpt.load(root, rank=0)["model"]["w"], torch.ones(3))
    assert torch.equal(ckpt.load(root, rank="all")[0]["model"]["w"], torch.ones(3))
    with pytest.raises(ckpt.CheckpointError):
        ckpt.load(root, step=1, rank=1)
    with pytest.raises(ValueError, match="not both"):
        ckpt.load(root, rank=0, process_group=dist.ProcessGroup(dist.HashStore(), 0, 1))
    with pytest.raises(ValueError, match="commit_timeout_s"):
        ckpt.Checkpointer(root + "2", commit_timeout_s=0)
    with pytest.raises(TypeError, match="process_group"):
        ckpt.Checkpointer(root + "2", process_group="world")
    with ckpt.Checkpointer(root, process_group=False) as cp:
        assert cp.world_size == 1


def test_both_placements_refused_at_save(root):
    with ckpt.Checkpointer(root, replicated=["model"], rank_local=lambda n: n.endswith(".rng")) as cp:
        with pytest.raises(ValueError, match=r"'model\.rng' is selected both"):
            cp.save_async(1, {"model": {"rng": torch.ones(1)}})
        cp.save(1, {"model": {"w": torch.ones(1)}, "x.rng": torch.ones(1)})


# -- multi-rank worlds ----------------------------------------------------------

@pytest.fixture
def workdir(tmp_path):
    return str(tmp_path / "work")


def _dir_bytes(path):
    total = 0
    for dirpath, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    return total


def test_ddp_two_ranks_full_and_exact_deltas(root, workdir, ckpt_restore):
    steps = 6
    w = workers.run_world("ddp_training", 2, workdir, timeout=150, root=root, steps=steps,
                          commit_timeout=OK_TIMEOUT)
    w.check()
    for rank in range(2):
        v = w.value(rank)
        assert v["errors"] == [], f"rank {rank}: " + "\n".join(v["errors"])
        assert v["newest"] == steps
        kinds = [v["kinds"][str(s)] for s in range(1, steps + 1)]
        assert kinds == ["full", "delta", "delta", "full", "delta", "delta"], kinds
        stats = v["stats"]
        assert (stats["rank"], stats["world_size"]) == (rank, 2), stats
        assert stats["ranks_wait_s"] is not None and stats["commit_latency_s"] is not None, stats
    assert ckpt.list_steps(root) == list(range(1, steps + 1))

    # Replicated tensors are stored once, spread over the ranks; the
    # rank-local ones once per rank.
    info = ckpt.describe(root, 1)
    assert info["world_size"] == 2
    replicated = [t for t in info["tensors"] if t["placement"] == "replicated"]
    local = [t for t in info["tensors"] if t["placement"] == "rank_local"]
    assert {t["name"].split(".")[0] for t in replicated} == {"model", "optim"}
    assert sorted({t["name"].split("/")[0] for t in local}) == ["rank0", "rank1"]
    assert len({t["rank"] for t in replicated}) == 2, "one rank wrote every replicated tensor"
    rep_bytes = sum(t["raw_bytes"] for t in replicated)
    local_bytes = sum(t["raw_bytes"] for t in local)
    on_disk = _dir_bytes(info["dir"])
    print(f"\nstep 1 on disk: {on_disk} bytes; replicated {rep_bytes} (stored once), "
          f"rank-local {local_bytes}; {on_disk / rep_bytes:.3f}x the replicated bytes")
    assert rep_bytes <= on_disk <= rep_bytes + local_bytes + 4096 * len(info["tensors"]) + (256 << 10)
    assert on_disk < 1.5 * rep_bytes

    # Without a group: one rank's part, or all of them; neither is refused.
    snaps = [torch.load(workers.snapshots_path(workdir, "ddp", r)) for r in range(2)]
    for rank in range(2):
        for step in (1, 3, steps):
            got = ckpt.load(root, step=step, rank=rank)
            assert workers.differences(got, snaps[rank][step]) == [], (rank, step)
    chosen, parts = ckpt.load(root, rank="all", with_step=True)
    assert chosen == steps and sorted(parts) == [0, 1]
    for rank in range(2):
        assert workers.differences(parts[rank], snaps[rank][steps]) == []
    with pytest.raises(ValueError, match=r"multi-rank checkpoint of 2 ranks: pass rank="):
        ckpt.load(root)
    # Into a state, without a group: what every rank's part holds alike (the
    # replicated tensors; plain values as rank 0 saved them) loads; a rank's
    # own tensors do not.
    want = {k[len("model."):]: v for k, v in snaps[0][steps]["tensors"].items()
            if k.startswith("model.")}
    into = ckpt.load(root, into={"model": {k: torch.zeros_like(v) for k, v in want.items()},
                                 "step": 0})
    assert into["step"] == steps
    assert all(torch.equal(into["model"][k], v) for k, v in want.items())
    with pytest.raises(ValueError, match=r"written by 2 ranks .* a rank's own .*'rng'"):
        ckpt.load(root, into={"rng": torch.get_rng_state(), "step": 0})

    # ckpt.export: one rank's part under its saved names, or the whole (read
    # back with the safetensors package, where it is installed).
    part_path = ckpt.export(root, os.path.join(workdir, "rank1.safetensors"), step=steps, rank=1)
    whole_path = ckpt.export(root, os.path.join(workdir, "all.safetensors"), step=steps)
    if importlib.util.find_spec("safetensors") is not None:
        from safetensors.torch import load_file
        part, want = load_file(part_path), snaps[1][steps]["tensors"]
        assert sorted(part) == sorted(want)
        assert all(torch.equal(workers._bits(part[n]), workers._bits(want[n])) for n in want)
        whole = load_file(whole_path)
        assert {"rank0/rng", "rank1/rng", "model.0.weight"} <= set(whole)
        assert torch.equal(whole["rank1/rng"], want["rng"])

    # ckpt-restore lists and verifies each multi-rank checkpoint as one unit.
    r = _restore(ckpt_restore, "--root", root, "--verify", "--all")
    assert r.returncode == 0, r.stdout + r.stderr
    r = _restore(ckpt_restore, "--root", root, "--latest", "--verify", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["step"] == steps


def test_fsdp_four_ranks_own_shards_topk(root, workdir):
    steps, dense = 5, 4
    w = workers.run_world("fsdp_shards", 4, workdir, timeout=170, root=root, steps=steps,
                          dense_step=dense, commit_timeout=OK_TIMEOUT)
    w.check()
    for rank in range(4):
        v = w.value(rank)
        assert v["errors"] == [], f"rank {rank}: " + "\n".join(v["errors"])
        assert [v["kinds"][str(s)] for s in range(1, steps + 1)] == ["full"] + ["delta"] * (steps - 1)
    info = ckpt.describe(root, steps)
    assert info["world_size"] == 4
    names = {t["name"] for t in info["tensors"]}
    assert {f"rank{r}/model.flat_shard" for r in range(4)} <= names
    assert "table" in names  # replicated: under its own name, once
    assert sum(t["name"] == "table" for t in info["tensors"]) == 1
    snaps = [torch.load(workers.snapshots_path(workdir, "fsdp", r)) for r in range(4)]
    parts = ckpt.load(root, step=2, rank="all")
    for rank in range(4):
        assert workers.differences(parts[rank], snaps[rank][2]) == [], rank


def test_failures_raise_on_every_rank_within_the_timeout(root, workdir, ckpt_restore):
    w = workers.run_world("failures", 2, workdir, timeout=150, root=root,
                          commit_timeout=FAIL_TIMEOUT)
    w.check()
    r0, r1 = w.value(0), w.value(1)
    limit = FAIL_TIMEOUT + 15

    # (a) rank 1's save_async raised; rank 0's save fails naming rank 1.
    assert r1["raised"]["type"] == "TypeError"
    failed = r0["raised"]
    assert failed is not None, "step 2 committed without rank 1"
    assert _mentions_rank(failed["message"], 1), failed
    assert failed["elapsed"] < limit, failed
    assert r0["after"] is None and r1["after"] is None, (r0["after"], r1["after"])
    assert ckpt.list_steps(os.path.join(root, "raises")) == [1, 3]
    r = _restore(ckpt_restore, "--root", os.path.join(root, "raises"), "--verify", "--all")
    assert r.returncode == 0, r.stdout + r.stderr

    # (b) different steps on the two ranks: an error on both, not a hang.
    for rank, v in enumerate((r0, r1)):
        assert v["steps"] is not None, f"rank {rank}'s save of step {10 + rank} committed"
        assert v["steps"]["elapsed"] < limit, v["steps"]
    assert ckpt.list_steps(os.path.join(root, "steps")) == []

    # (c) one name, default placement, different bytes: refused naming both
    # ranks; the same bytes are fine.
    for rank, v in enumerate((r0, r1)):
        failed = v["conflict"]
        assert failed is not None, f"rank {rank}: conflicting tensors committed"
        assert _mentions_rank(failed["message"], 0) and _mentions_rank(failed["message"], 1), failed
        assert '"w"' in failed["message"] or "'w'" in failed["message"] or " w " in failed["message"], \
            failed
        assert v["same"] is None, v["same"]
    assert ckpt.list_steps(os.path.join(root, "conflict")) == [2]


@pytest.mark.parametrize("victim", [1, 0], ids=["rank1", "rank0_hosting_the_store"])
def test_rank_killed_mid_save(root, workdir, ckpt_restore, victim):
    survivor = 1 - victim
    w = workers.run_world("killed", 2, workdir, timeout=120, root=root,
                          commit_timeout=FAIL_TIMEOUT,
                          env={victim: {"CKPT_KILL_POINT": "save.written:2"}})
    assert w.exitcodes[victim] == -9, f"victim {victim} was not killed:\n{w.describe(victim)}"
    failure = w.value(survivor)["failure"]
    assert failure is not None, "step 2 committed although a rank died writing it"
    assert failure["elapsed"] < FAIL_TIMEOUT + 15, failure
    if victim == 1:
        assert _mentions_rank(failure["message"], victim), failure
    print(f"\nrank {victim} killed: rank {survivor} failed after {failure['elapsed']:.2f} s: "
          f"{failure['message']}")
    # Nothing of step 2 is visible; step 1 is the newest and verifies.
    assert ckpt.list_steps(root) == [1]
    r = _restore(ckpt_restore, "--root", root, "--latest", "--verify", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["step"] == 1
    # A restarted group resumes from step 1 and saves step 2.
    w = workers.run_world("restarted", 2, workdir, timeout=120, root=root,
                          commit_timeout=OK_TIMEOUT)
    w.check()
    for rank in range(2):
        v = w.value(rank)
        assert v["errors"] == [] and v["resumed"] == 1 and v["newest"] == 2, v
    assert ckpt.list_steps(root) == [1, 2]
    r = _restore(ckpt_restore, "--root", root, "--verify", "--all")
    assert r.returncode == 0, r.stdout + r.stderr


def test_load_with_group_agrees_on_the_step(root, workdir, tmp_path):
    w = workers.run_world("killed", 2, workdir, timeout=120, root=root, commit_timeout=OK_TIMEOUT)
    w.check()
    assert ckpt.list_steps(root) == [1, 2]
    # Damage one record of rank 1's part of step 2.
    info = ckpt.describe(root, 2)
    t = next(t for t in info["tensors"] if t["rank"] == 1 and t["raw_bytes"] > 4096)
    with open(os.path.join(info["dir"], t["shard"]), "r+b") as f:
        f.seek(t["offset"] + 1000)
        byte = f.read(1)
        f.seek(t["offset"] + 1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ckpt.CorruptCheckpointError):
        ckpt.verify(root, 2, rank=1)
    ckpt.verify(root, 2, rank=0)
    empty = str(tmp_path / "empty")
    os.makedirs(empty)
    w = workers.run_world("load_fallback", 2, workdir, timeout=120, root=root, empty_root=empty)
    w.check()
    v0, v1 = w.value(0), w.value(1)
    assert v0["step"] == v1["step"] == 1 and v0["step_into"] == v1["step_into"] == 1, (v0, v1)
    assert v0["missing"] is not None and v0["missing"] == v1["missing"], (v0, v1)
    assert v0["missing"]["type"] == "CheckpointNotFoundError", v0
    assert v0["damaged"] is not None and v0["damaged"] == v1["damaged"], (v0, v1)
    assert v0["damaged"]["type"] == "CorruptCheckpointError", v0
    assert _mentions_rank(v0["damaged"]["message"], 1), v0


def test_complex_float8_and_numpy_values_across_ranks(root, workdir):
    """A group saves replicated complex, float8 and numpy values and a
    rank-local numpy RNG state (full, then an exact delta); both ranks load
    every step bit-exactly, with the replicated values read once and
    broadcast, and each read by every rank."""
    w = workers.run_world("read_once_workers:wider_values", 2, workdir, timeout=240, root=root)
    w.check()
    for r in range(2):
        assert w.value(r)["errors"] == [], f"rank {r}: " + "\n".join(w.value(r)["errors"])
    dtypes = w.value(0)["dtypes"]
    assert dtypes["model.freqs_cis"] == "complex64" and dtypes["model.big"] == "complex128", dtypes
    assert dtypes["model.w8"] == "float8_e5m2" and dtypes["model.table"] == "float64", dtypes


def test_load_reads_replicated_state_once(root, workdir):
    """With a group, each replicated tensor is read from storage by one rank
    and broadcast: bit-exact on every rank (fresh, into a model with tied
    weights, a non-contiguous destination, a delta step), every replicated
    byte read once in total; read_once=False reads it on every rank; a
    damaged replicated record read by rank 1 makes both ranks fall back."""
    w = workers.run_world("read_once_workers:read_once", 2, workdir, timeout=240, root=root)
    w.check()
    v0, v1 = w.value(0), w.value(1)
    for r, v in enumerate((v0, v1)):
        assert v["errors"] == [], f"rank {r}: " + "\n".join(v["errors"])
    for step in (1, 3):  # full checkpoints: bytes read against their size on disk
        info = ckpt.describe(root, step)
        on_disk = _dir_bytes(info["dir"])
        rep = sum(t["raw_bytes"] for t in info["tensors"] if t["placement"] == "replicated")
        for kind in range(2):  # fresh, into
            s0, s1 = v0["loads"][str(step)][kind], v1["loads"][str(step)][kind]
            total = s0["bytes_read"] + s1["bytes_read"]
            print(f"\nstep {step} {'into' if kind else 'fresh'}: ranks read {s0['bytes_read']} + "
                  f"{s1['bytes_read']} = {total / on_disk:.3f}x its {on_disk} bytes; received "
                  f"{s0['bytes_received']} + {s1['bytes_received']}")
            assert total <= 1.05 * on_disk, (step, kind, s0, s1, on_disk)
            assert s0["shared_tensors"] == s1["shared_tensors"] > 300, (s0, s1)
            assert s0["opens"] == s1["opens"] == 1, (s0, s1)  # one StepReader: one open per load
            for s in (s0, s1):  # each rank read some and received the rest
                assert 0.25 * rep < s["bytes_received"] < 0.75 * rep, (s, rep)
    for kind in range(2):  # every rank reads all of it itself
        s0, s1 = v0["loads"]["all_read"][kind], v1["loads"]["all_read"][kind]
        assert "bytes_received" not in s0 and "bytes_received" not in s1, (s0, s1)
    assert v0["damaged"].startswith("model.") or v0["damaged"].startswith("optim."), v0["damaged"]
    for v in (v0, v1):
        assert v["fallback"]["steps"] == [2, 2], v["fallback"]
        assert any("skipped step 3" in m for m in v["fallback"]["warnings"]), v["fallback"]
        assert v["damaged_step"]["type"] == "CorruptCheckpointError", v["damaged_step"]
        assert _mentions_rank(v["damaged_step"]["message"], 1), v["damaged_step"]
        assert v0["damaged"] in v["damaged_step"]["message"], v["damaged_step"]
