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
        for r in responses:
            try:
                out["done"].append(r.tier_completion.result(timeout=180))
            except Exception as e:  # noqa: BLE001 -- the test looks at it
                out["done"].append({"error": f"{type(e).__name__}: {e}"})
        out["waited"] = cp.wait_tier(timeout=180)
        out["status"] = {str(k): v["state"] for k, v in cp.tier_status().items()}
    dist.barrier()
    if ctx.broken_rank is None:
        for step in (1, 2, 3):
            got = ckpt.load(ctx.url, step=step, process_group=ctx.group)
            out["errors"] += [f"step {step}: {d}" for d in differences(got, snaps[step])]
    return out
