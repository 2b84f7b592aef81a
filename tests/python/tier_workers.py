"""Ranks of the multi-rank upload-behind-the-save tests (test_s3.py): a
2-rank Checkpointer with tier="s3://..." against moto, each rank uploading
its own part, one marker per step."""
import os

import torch
import torch.distributed as dist

import ckpt
from distributed_workers import differences, snapshot


def _state(rank, step):
    g = torch.Generator().manual_seed(step)  # the replicated model: the same on every rank
    return {"model": {"w": torch.randn(60000, generator=g), "b": torch.arange(step, step + 40)},
            "rng": torch.full((300,), float(10 * rank + step)), "step": step}


def _tier_outcomes(cp, responses, out):
    """Each save's tier outcome (or its error) into out["done"], then
    whether wait_tier() returned in time and every step's tier state."""
    for r in responses:
        try:
            out["done"].append(r.tier_completion.result(timeout=180))
        except Exception as e:  # noqa: BLE001 -- the test looks at it
            out["done"].append({"error": f"{type(e).__name__}: {e}"})
    out["waited"] = cp.wait_tier(timeout=180)
    out["status"] = {str(k): v["state"] for k, v in cp.tier_status().items()}


def tier_group(ctx):
    """Saves 3 steps (full, exact delta, full) with tier=ctx.url; returns each
    save's tier outcome, the tier status, and whether every rank's part
    loads back from the bucket (with the group) as it was saved. With
    ctx.broken_rank, that rank has no credentials: its part cannot upload."""
    os.environ.update(ctx.aws)
    if ctx.broken_rank == ctx.rank:
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            os.environ.pop(k, None)
        os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.environ["AWS_CONFIG_FILE"] = "/nonexistent/ckpt"
        os.environ["AWS_EC2_METADATA_DISABLED"] = "true"  # no instance to ask either
    out = {"done": [], "errors": []}
    snaps = {}
    with ckpt.Checkpointer(ctx.root, tier=ctx.url, delta="exact", full_every=2, replicated=["model"],
                           rank_local=["rng"], commit_timeout_s=60, tier_part_bytes=5 << 20) as cp:
        responses = []
        for step in (1, 2, 3):
            state = _state(ctx.rank, step)
            snaps[step] = snapshot(state)
            responses.append(cp.save_async(step, state))
        _tier_outcomes(cp, responses, out)
    dist.barrier()
    if ctx.broken_rank is None:
        for step in (1, 2, 3):
            got = ckpt.load(ctx.url, step=step, process_group=ctx.group)
            out["errors"] += [f"step {step}: {d}" for d in differences(got, snaps[step])]
    return out


def tier_node_local(ctx):
    """As tier_group, but the ranks share no file system
    (shared_root=False): each commits its copy of every step in
    ROOT/rank-<r> and uploads its part from there. Saves 4 steps (full,
    delta, full, delta); returns the tier outcomes, which files each rank's
    copies hold, what is left locally once every step is durable, and
    whether every step loads back from the bucket (with the group) as saved."""
    os.environ.update(ctx.aws)
    out = {"done": [], "errors": [], "foreign": []}
    snaps = {}
    try:
        ckpt.Checkpointer(ctx.root, shared_root=False)
        out["errors"].append("shared_root=False without a tier opened")
    except ValueError as e:
        if "needs tier=" not in str(e):
            out["errors"].append(f"shared_root=False without a tier: {e}")
    with ckpt.Checkpointer(ctx.root, tier=ctx.url, shared_root=False, delta="exact", full_every=2,
                           replicated=["model"], rank_local=["rng"], commit_timeout_s=60,
                           tier_part_bytes=5 << 20) as cp:
        out["local_dir"] = cp.local_dir
        responses = []
        for step in (1, 2, 3, 4):
            state = _state(ctx.rank, step)
            snaps[step] = snapshot(state)
            responses.append(cp.save_async(step, state))
            responses[-1].result(timeout=120)  # committed here: look at this rank's copy
            copy = os.path.join(cp.local_dir, f"step-{step:020d}")
            out["foreign"] += [f"step {step}: {f}" for f in os.listdir(copy)
                               if f != "MANIFEST.json" and not f.startswith(f"rank-{ctx.rank:05d}.")]
        _tier_outcomes(cp, responses, out)
    out["left"] = sorted(os.listdir(out["local_dir"]))
    dist.barrier()
    for step in (1, 2, 3, 4):
        got = ckpt.load(ctx.url, step=step, process_group=ctx.group)
        out["errors"] += [f"step {step}: {d}" for d in differences(got, snaps[step])]
    return out


def tier_failed_save_on_one_rank(ctx):
    """The upload of a step whose save failed on one rank only: that rank's
    _Tier.skip tells the others at once, so their upload fails within
    seconds naming it (it used to wait an hour for the part). Twice for
    step 1, the failing rank swapped: the second round's keys are its own."""
    import time
    from ckpt import _tier
    os.environ.update(ctx.aws)
    out = {"rounds": []}
    with ckpt.Checkpointer(ctx.root, tier=ctx.url, replicated=["model"], rank_local=["rng"],
                           commit_timeout_s=60, tier_part_bytes=5 << 20) as cp:
        cp.save_async(1, _state(ctx.rank, 1)).result(timeout=120)
        cp.wait_tier(timeout=120)
    tier = _tier._Tier(ctx.root, ctx.url, 2, 5 << 20, 0, ctx.group, "test/failed-save")
    try:
        for failing in (1, 0):
            start = time.monotonic()
            future = _tier.new_future()
            if ctx.rank == failing:
                tier.skip(1, future, "the save failed: injected")
            else:
                tier.submit(1, future)
            try:
                result = future.result(timeout=120)
            except Exception as e:  # noqa: BLE001 -- the test looks at it
                result = {"error": str(e)}
            out["rounds"].append({"failing": failing, "seconds": time.monotonic() - start, **result})
        dist.barrier()  # rank 0's process hosts the store: it stays until rank 1 read its last key
    finally:
        tier.close()
    return out
