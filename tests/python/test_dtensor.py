"""DTensor state: saved by N ranks as chunks of global tensors, loaded on any
number of ranks, into any layout (gloo on CPU, ranks spawned through
distributed_workers.run_world; the rank bodies are in dtensor_workers.py).

  * 4 ranks save Shard(0) DTensors of every dtype (random bytes: every bit
    pattern), shapes not divisible by the rank counts ([13, 7], [5],
    [6, 5, 3]), a 32 MiB float32 one, and three on a 2x2 mesh
    ([Shard(0), Shard(1)], [Replicate(), Shard(0)], [Shard(1), Replicate()]);
    a full save, then an exact delta.
  * 1, 2, 3 and 4 ranks load the delta step into Shard(0), Shard(1) and
    Replicate() layouts (4 ranks also into a 2x2 mesh): every element of
    every local tensor is bit-exact against the global tensor; the bytes read
    for the big tensor are what its box needs (same-dim resharding within
    5 %; Shard(0) -> Shard(1) at most the whole tensor).
  * One process without a group: load() gives the global tensors, load(into=)
    fills plain tensors; describe() lists the chunks.
  * A DTensor tied under two names (tied embeddings) is one global tensor:
    saved by 2 ranks, loaded on 3 into a tied DTensor of another layout, and
    on one process as one tensor under both names.
  * FSDP2 (fully_shard) on 2 ranks: model + AdamW saved through
    get_state_dict, resumed on 1 and on 4 ranks; the losses continue as the
    unsharded reference run's.
"""
import pytest
import torch

import ckpt

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)
try:
    import torch.distributed.tensor  # noqa: F401
except ImportError:
    pytest.skip("no torch.distributed.tensor (torch < 2.5)", allow_module_level=True)

import distributed_workers as workers  # noqa: E402
import dtensor_workers as dw  # noqa: E402

LAYOUTS = ["shard0", "shard1", "replicate"]
MIB = 1 << 20


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A root with steps 1 (full) and 2 (delta) saved by 4 ranks."""
    base = tmp_path_factory.mktemp("dtensor")
    root, workdir = str(base / "ckpts"), str(base / "work")
    w = workers.run_world("dtensor_workers:save_sharded", 4, workdir, timeout=150, root=root)
    w.check()
    assert w.value(0)["kinds"] == {"1": "full", "2": "delta"}
    return root, workdir


def test_manifest_shows_global_tensors_with_chunks(saved):
    root, _ = saved
    info = ckpt.describe(root, 1)
    assert info["world_size"] == 4
    by_name = {t["name"]: t for t in info["tensors"]}
    t = by_name["t.float32_13x7"]
    assert (t["shape"], t["placement"], t["rank"]) == ([13, 7], "sharded", -1)
    # torch.chunk's split: 4, 4, 4, 1 rows.
    assert sorted((c["offset"], c["shape"]) for c in t["chunks"]) == \
        [([0, 0], [4, 7]), ([4, 0], [4, 7]), ([8, 0], [4, 7]), ([12, 0], [1, 7])]
    # [5] over 4 ranks: 2, 2, 1 and nothing (the empty shard writes no chunk).
    assert sorted(c["shape"] for c in by_name["t.int8_5"]["chunks"]) == [[1], [2], [2]]
    # [Replicate(), Shard(0)] on 2x2: each box once, by the ranks at dp == 0.
    grid_b = by_name["grid_b"]["chunks"]
    assert sorted((c["rank"], c["offset"]) for c in grid_b) == [(0, [0, 0]), (1, [4, 0])]
    assert by_name["plain"]["placement"] == "replicated"
    meta = info["extras"]["ckpt.python"]["dtensors"]  # for information: mesh and placements
    assert meta["grid_a"] == {"mesh_shape": [2, 2], "mesh_dim_names": ["dp", "tp"],
                              "placements": ["Shard(0)", "Shard(1)"]}
    # Deltas are per chunk.
    delta = {t["name"]: t for t in ckpt.describe(root, 2)["tensors"]}["big"]
    assert all(c["encoding"] != "raw" for c in delta["chunks"]), delta["chunks"]
    ckpt.verify(root, 2)


def test_one_process_loads_global_tensors(saved):
    root, _ = saved
    want = dw.global_state(2)
    state = ckpt.load(root)
    assert state["step"] == 2 and torch.equal(state["plain"], torch.arange(10) * 2)
    flat = {f"t.{k}": v for k, v in state["t"].items()}
    flat.update({k: state[k] for k in ["big"] + list(dw.GRIDS)})
    assert sorted(flat) == sorted(want)
    for name, t in flat.items():
        assert type(t) is torch.Tensor and t.shape == want[name].shape, name
        assert torch.equal(dw._bits(t), dw._bits(want[name])), name
    # Into plain tensors: the global tensors, step 1.
    into = {"t": {k: torch.zeros_like(v) for k, v in state["t"].items()},
            "grid_a": torch.zeros(10, 9)[:, :9].t().contiguous().t(), "step": 0}
    ckpt.load(root, step=1, into=into)
    old = dw.global_state(1)
    assert into["step"] == 1
    assert torch.equal(into["grid_a"], old["grid_a"])
    for k, v in into["t"].items():
        assert torch.equal(dw._bits(v), dw._bits(old[f"t.{k}"])), k


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_reshard_onto_ranks(saved, world):
    root, workdir = saved
    layouts = LAYOUTS + (["2d"] if world == 4 else [])
    w = workers.run_world("dtensor_workers:load_resharded", world, workdir, timeout=150, root=root,
                          step=2, layouts=layouts)
    w.check()
    values = [w.value(r) for r in range(world)]
    for rank, v in enumerate(values):
        assert v["mismatches"] == [], f"rank {rank}: {v['mismatches'][:10]}"
    whole = dw.BIG[0] * dw.BIG[1] * 4
    for name in layouts:
        read = sum(v["big"][name]["bytes_read"] for v in values)
        needed = sum(v["big"][name]["needed"] for v in values)
        assert all(v["big"][name]["bytes_loaded"] == v["big"][name]["needed"] for v in values)
        print(f"\n{world} ranks, {name}: read {read / MIB:.2f} MiB for {needed / MIB:.2f} MiB "
              f"needed ({read / needed:.4f}x); per rank "
              f"{[round(v['big'][name]['bytes_read'] / MIB, 2) for v in values]} MiB")
        for rank, v in enumerate(values):
            got = v["big"][name]
            assert got["bytes_read"] >= got["needed"], (rank, name, got)
        if name in ("shard1", "2d"):  # columns of every chunk: at most the whole tensor per rank
            for rank, v in enumerate(values):
                assert v["big"][name]["bytes_read"] <= whole * 1.01, (rank, v["big"][name])
        else:  # rows (or all of it): within 5 % of what the boxes hold
            assert read <= 1.05 * needed, (name, read, needed)


def test_tied_dtensors_are_one_global_tensor_on_any_layout(tmp_path):
    root, workdir = str(tmp_path / "ckpts"), str(tmp_path / "work")
    saved = workers.run_world("dtensor_workers:save_tied", 2, workdir, timeout=120, root=root)
    saved.check()
    assert saved.value(0)["kinds"] == {"1": "full", "2": "delta"}
    info = ckpt.describe(root, 2, rank=0)
    assert sorted(t["name"] for t in info["tensors"]) == ["model.emb", "model.other"]
    assert info["extras"]["ckpt.python"]["aliases"] == {"model.head": "model.emb"}
    loaded = workers.run_world("dtensor_workers:load_tied", 3, workdir, timeout=120, root=root)
    loaded.check()
    assert all(loaded.value(r) == {"exact": True, "other": True} for r in range(3))
    state = ckpt.load(root, step=2)  # one process: the global tensors
    assert state["model"]["head"] is state["model"]["emb"]
    assert torch.equal(dw._bits(state["model"]["emb"]), dw._bits(dw.global_tensor("tied", dw.TIED, torch.float32, 2)))


def test_fsdp2_resumes_on_one_and_four_ranks(tmp_path):
    if dw.fully_shard_api() is None:
        pytest.skip("this torch has no FSDP2 fully_shard")
    root, workdir = str(tmp_path / "ckpts"), str(tmp_path / "work")
    steps, save_at = 8, 4
    reference = dw.reference_losses(steps)
    w = workers.run_world("dtensor_workers:fsdp_train", 2, workdir, timeout=150, root=root,
                          steps=steps, save_at=save_at)
    w.check()
    trained = w.value(0)["losses"]
    assert trained == pytest.approx(reference, rel=1e-4, abs=1e-6)
    info = ckpt.describe(root, save_at)
    assert any(t["placement"] == "sharded" and t["name"].startswith("optim.state.")
               for t in info["tensors"])
    for world in (1, 4):
        w = workers.run_world("dtensor_workers:fsdp_resume", world, workdir, timeout=150,
                              root=root, steps=steps)
        w.check()
        for rank in range(world):
            v = w.value(rank)
            assert v["resumed"] == save_at, v
            assert v["losses"] == pytest.approx(reference[save_at:], rel=1e-4, abs=1e-6), \
                (world, rank, v["losses"], reference[save_at:])
