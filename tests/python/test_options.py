"""Checkpointer options reach the engine: compression, top-k deltas, skip when busy."""
import os

import pytest
import torch

import ckpt
from training import assert_topk_restored


def test_compression_round_trips(root):
    state = {"zeros": torch.zeros(1 << 20), "ramp": torch.arange(1 << 16, dtype=torch.int64)}
    with ckpt.Checkpointer(root, compression=3) as cp:
        stats = cp.save(1, state)
    assert stats["file_bytes"] < stats["tensor_bytes"] // 4
    got = ckpt.load(root)
    assert torch.equal(got["zeros"], state["zeros"]) and torch.equal(got["ramp"], state["ramp"])


@pytest.mark.parametrize("delta_base", ["differential", "chained"])
def test_topk_deltas_keep_the_largest_changes_and_record_their_error(root, delta_base):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(10000, generator=g)
    saved, kinds = {}, {}
    with ckpt.Checkpointer(root, delta="topk", topk_ratio=0.05, full_every=4, delta_base=delta_base) as cp:
        for step in range(1, 5):
            w += 0.01 * torch.randn(10000, generator=g)
            saved[step] = w.clone()
            kinds[step] = cp.save(step, {"w": w})["kind"]
    assert kinds == {1: "full", 2: "delta", 3: "delta", 4: "delta"}
    base = None
    for step, want in saved.items():
        got = ckpt.load(root, step=step)["w"]
        if kinds[step] == "full":
            assert torch.equal(got, want)
            base = got
            continue
        # The error computed from the values (the delta's base: the full
        # save, or the step before as restored) -- then the recorded bound.
        error = assert_topk_restored(want, got, base, 0.05, f"step {step}")
        assert error > 0, f"step {step}: nothing dropped, the test proves nothing"
        bound = next(t["error_bound"] for t in ckpt.describe(root, step)["tensors"] if t["name"] == "w")
        assert abs(bound - error) <= 1e-6 * error, f"step {step}: recorded {bound}, computed {error}"
        if delta_base == "chained":
            base = got


def test_invalid_option_values_are_refused(root):
    with pytest.raises((ValueError, ckpt.CheckpointError)):
        ckpt.Checkpointer(root, compression=99)
    with pytest.raises(ValueError, match="staging_bytes"):
        ckpt.Checkpointer(root, staging_bytes=-1)
    with pytest.raises(ValueError, match="unknown engine option"):
        ckpt.Checkpointer(root, colour="blue")


def test_options_are_checked_before_they_are_serialized(root, tmp_path):
    with pytest.raises(ValueError, match='unknown engine option "some_unknown"'):
        ckpt.Checkpointer(root, some_unknown=object())
    with pytest.raises(ValueError, match='engine option "chunk_bytes" is .*object'):
        ckpt.Checkpointer(root, chunk_bytes=object())
    with pytest.raises(ValueError, match='engine option "stall_timeout_s" is nan'):
        ckpt.Checkpointer(root, stall_timeout_s=float("nan"))
    for name, bad in [("full_every", object()), ("full_every", True), ("topk_ratio", "0.1"),
                      ("topk_ratio", float("inf")), ("staging_bytes", 1.5), ("lazy", "yes"),
                      ("compression", object())]:
        with pytest.raises(ValueError, match=name):
            ckpt.Checkpointer(root, **{name: bad})
    assert not os.path.exists(root)  # refused before the engine opened (or created) it
    with ckpt.Checkpointer(root, metrics_jsonl_path=tmp_path / "m.jsonl") as cp:  # os.PathLike
        cp.save(1, {"x": torch.ones(1)})
    assert (tmp_path / "m.jsonl").exists()


@pytest.mark.parametrize("value", [object(), b"wait", ["wait"], {"a": 1}, {1, 2}, 1j, float("-inf")],
                         ids=["object", "bytes", "list", "dict", "set", "complex", "-inf"])
def test_option_values_json_cannot_hold_are_refused_naming_the_option(root, value):
    # json.dumps would raise TypeError (or write -Infinity) for these: each is
    # refused first, with a ValueError that names the option.
    for name in ("when_busy", "metrics_jsonl_path", "queue_depth"):
        with pytest.raises(ValueError, match=f'engine option "{name}" is '):
            ckpt.Checkpointer(root, **{name: value})
    with pytest.raises(ValueError, match='unknown engine option "no_such_option"'):
        ckpt.Checkpointer(root, no_such_option=value)
    assert not os.path.exists(root)


def test_skip_when_busy_reports_skipped_saves(root):
    # 64 MB saves through 80 MB of staging, back to back: each save after the
    # first arrives while the one before still holds its staging memory (a
    # 64 MB copy takes milliseconds, writing and fsyncing it far longer).
    state = {"x": torch.randn(16 << 20)}
    with ckpt.Checkpointer(root, when_busy="skip", staging_bytes=80 << 20) as cp:
        responses = [cp.save_async(step, state) for step in range(1, 6)]
        results = [r.result() for r in responses]
    skipped = [r["step"] for r in results if r["skipped"]]
    committed = ckpt.list_steps(root)
    assert skipped, "no save was skipped although each arrived while the previous one was busy"
    assert committed and set(committed).isdisjoint(skipped)
    assert sorted(committed + skipped) == [1, 2, 3, 4, 5]


def test_engine_tuning_options_reach_the_engine(root):
    # 64 KiB chunks, one shard per module, a single encode buffer: the stats show it.
    state = {f"block{i}.w": torch.randn(20000) for i in range(12)}
    with ckpt.Checkpointer(root, delta="exact", chunk_bytes=64 << 10, shard_min_bytes=0,
                           shard_max_bytes=1 << 20, encode_buffers=1, stall_timeout_s=120,
                           watchdog_timeout_s=60) as cp:
        assert cp.save(1, state)["shard_count"] == 12
        for t in state.values():
            t += 1e-3
        assert cp.save(2, state)["kind"] == "delta"
    got = ckpt.load(root)
    assert all(torch.equal(got[k], v) for k, v in state.items())
    for bad in ({"chunk_bytes": -1}, {"stall_timeout_s": -1.0}, {"encode_buffers": 0}):
        with pytest.raises((ValueError, ckpt.CheckpointError)):
            ckpt.Checkpointer(root, **bad)


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_staging_threads_and_background_nice_reach_the_engine(tmp_path, threads):
    # Tensors far larger than one copy batch (32 MiB), mixed with tiny ones.
    state = {"embed.weight": torch.randn(12 << 20), "norm.weight": torch.randn(7),
             "layers.0.w": torch.randn(300, 301, dtype=torch.float64), "step": 3}
    root = tmp_path / f"t{threads}"
    with ckpt.Checkpointer(root, staging_threads=threads, background_nice=0) as cp:
        cp.save(1, state)
        state["embed.weight"].add_(1.0)
        cp.save(2, state)
    got = ckpt.load(root)
    assert all(torch.equal(got[k], state[k]) for k in ("embed.weight", "norm.weight", "layers.0.w"))
    ckpt.verify(root, 2)
    for bad in ({"staging_threads": -1}, {"staging_threads": 65}, {"background_nice": 20}):
        with pytest.raises((ValueError, ckpt.CheckpointError), match=next(iter(bad))):
            ckpt.Checkpointer(tmp_path / "bad", **bad)


def test_reserve_allocates_staging_memory_before_the_first_save(root):
    state = {"w": torch.randn(1 << 20), "b": torch.randn(1000), "step": 7}
    with ckpt.Checkpointer(root) as cp:
        assert cp.stats()["staging_bytes"] == 0
        cp.reserve(state, wait=True)
        reserved = cp.stats()["staging_bytes"]
        assert reserved >= (1 << 20) * 4
        cp.save(1, state)
        assert cp.stats()["staging_bytes"] == reserved  # the save fit: no reallocation
    with ckpt.Checkpointer(root, staging_bytes=1 << 20) as cp:
        fixed = cp.stats()["staging_bytes"]  # (at least two chunks)
        cp.reserve(state, wait=True)  # fixed pool: nothing to do
        assert cp.stats()["staging_bytes"] == fixed


def test_docs_list_exactly_the_engine_options():
    # docs/options.md is the one written list of the keys; the library's
    # table is the one in the code. They must name the same keys.
    import re
    page = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "options.md")
    with open(page) as f:
        documented = re.findall(r"^\| `([a-z_0-9]+)` \|", f.read(), re.M)
    assert len(documented) == len(set(documented)), "a key is listed twice"
    assert sorted(documented) == sorted(torch.ops.ckpt.engine_option_names())


def test_background_nice_takes_minus_one_as_documented(root):
    # -1 is the documented default ("automatic"); the extension's parser used
    # to refuse it as a negative count.
    with ckpt.Checkpointer(root, background_nice=-1) as cp:
        cp.save(1, {"x": torch.ones(4)})
    with pytest.raises((ValueError, ckpt.CheckpointError), match="background_nice"):
        ckpt.Checkpointer(root, background_nice=-2)
