#!/usr/bin/env python3
"""reshard bench: a DTensor state saved by 2 ranks, loaded by 1 and by 2 ranks
(resharding 2 -> 1, and 2 -> 2), with ckpt against torch.distributed.checkpoint
(DCP) saving and loading the same DTensors in the same run.

The state is shaped like a transformer's training state (~350 MiB by
default, float32): an embedding, --layers blocks of attention and MLP
weights and norms, and AdamW-like exp_avg / exp_avg_sq of each; every tensor
a DTensor Shard(0) on a 1-D mesh of the saving ranks (uneven where the rows
do not divide). Each phase runs its ranks as processes of a fresh gloo group
over TCP (rank 0 hosts the store):

  save    2 ranks: ckpt (a multi-rank Checkpointer, each rank writing its
          chunks), then (ckpt's pages dropped from the cache, untimed)
          dcp.save of the same DTensors through FileSystemWriter(thread_count=
          --dcp-threads, sync_files=True): both fsync their files, neither
          pays a system-wide sync in its timed save.
  load    1 rank (a 1-rank mesh: the whole tensors) and 2 ranks (Shard(0)
          again), --repeat rounds (at least 3) in alternating order; each load
          runs in fresh rank processes, which first load a small checkpoint of
          the same loader (its one-time set-up, untimed), then drop the page
          cache (drop_caches as root, else fadvise DONTNEED; recorded), then
          every rank loads in place into DTensors of its own mesh:
          ckpt.load(into=, process_group=, step=) or dcp.load. Time: from a
          barrier to the last rank done; medians with min and max.

bytes_read_over_needed is, summed over the ranks, the bytes ckpt read from
shard files (the reader's count, block rounding included) over the bytes of
the boxes the ranks' DTensors hold. One JSON line:

    {"bench": "reshard", "bytes": ..., "load_over_dcp_load": <worst case>,
     "bytes_read_over_needed": <worst case>, "cases": {"2to1": {...}, "2to2": {...}}, ...}

    python3 bench/reshard_bench.py [--dir DIR] [--layers 4] [--d 512] [--vocab 32000]
                                   [--repeat 2] [--quick] [--keep]
"""
import argparse
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_ranks import run_ranks, write_result  # noqa: E402


def log(msg):
    print(f"[reshard] {msg}", file=sys.stderr, flush=True)


def shapes(vocab, d, layers):
    """{name: shape} of the model's parameters."""
    out = {"embed.weight": [vocab, d]}
    for i in range(layers):
        p = f"blocks.{i}."
        out.update({p + "attn.qkv.weight": [3 * d, d], p + "attn.proj.weight": [d, d],
                    p + "mlp.up.weight": [4 * d, d], p + "mlp.down.weight": [d, 4 * d],
                    p + "norm1.weight": [d], p + "norm2.weight": [d]})
    out["head.norm.weight"] = [d]
    return out


def build_state(args, mesh, fill):
    """{"model": {name: DTensor}, "optim": {name: {"exp_avg", "exp_avg_sq"}}}: Shard(0)
    DTensors whose local tensors are this rank's rows, random (fill) or zeros."""
    import torch
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    gen = torch.Generator().manual_seed(1 + mesh.get_coordinate()[0])

    def dtensor(shape):
        local_shape, _ = compute_local_shape_and_global_offset(shape, mesh, [Shard(0)])
        local = torch.randn(local_shape, generator=gen) if fill else torch.zeros(local_shape)
        return DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=torch.Size(shape),
                                  stride=torch.empty(shape, device="meta").stride())

    model = {n: dtensor(s) for n, s in shapes(args.vocab, args.d, args.layers).items()}
    optim = {n: {"exp_avg": dtensor(list(t.shape)), "exp_avg_sq": dtensor(list(t.shape))}
             for n, t in model.items()}
    return {"model": model, "optim": optim}


class _Tiny:
    """`build_state`'s arguments for the small warm-up state."""
    vocab, d, layers = 64, 16, 1


def _rank_main(rank, world, port, phase, args, workdir, out_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    import torch.distributed.checkpoint as dcp
    import ckpt
    sys.path.insert(0, HERE)
    from peers_bench import drop_page_cache

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=args.timeout))
    group = dist.group.WORLD
    mesh = init_device_mesh("cpu", (world,))
    ckpt_root, dcp_dir = os.path.join(workdir, "ckpt"), os.path.join(workdir, "dcp")
    warm_ckpt, warm_dcp = os.path.join(workdir, "warm-ckpt"), os.path.join(workdir, "warm-dcp")
    record = {}
    if phase == "save":
        state = build_state(args, mesh, fill=True)
        with ckpt.Checkpointer(ckpt_root, process_group=group, commit_timeout_s=args.timeout) as cp:
            dist.barrier()
            start = time.time()
            cp.save(1, state)
            dist.barrier()
            record["ckpt_save_s"] = time.time() - start
        # ckpt's pages out of the cache before DCP writes (not timed); DCP
        # fsyncs its own files (sync_files=True), as ckpt does: no
        # system-wide sync inside its timed save.
        if rank == 0:
            record["cache"] = drop_page_cache([ckpt_root])
        dist.barrier()
        start = time.time()
        dcp.save(state, storage_writer=dcp.FileSystemWriter(dcp_dir, thread_count=args.dcp_threads,
                                                            sync_files=True))
        dist.barrier()
        record["dcp_save_s"] = time.time() - start
        # Small checkpoints of both, for the loaders' one-time set-up.
        tiny = {"warm": build_state(_Tiny, mesh, fill=True)["model"]}
        with ckpt.Checkpointer(warm_ckpt, process_group=group, commit_timeout_s=args.timeout) as cp:
            cp.save(1, tiny)
        dcp.save(tiny, checkpoint_id=warm_dcp)
        if rank == 0:
            os.sync()  # not timed: everything settles before the loads
        dist.barrier()
    else:
        # One loader per process: phase "load-ckpt" or "load-dcp".
        loader = phase.split("-", 1)[1]
        state = build_state(args, mesh, fill=False)
        tiny = {"warm": build_state(_Tiny, mesh, fill=False)["model"]}
        # First-call set-up (planner, metadata, extension) outside the timed call.
        if loader == "ckpt":
            ckpt.load(warm_ckpt, step=1, into=tiny, process_group=group)
        else:
            dcp.load(tiny, checkpoint_id=warm_dcp)
        if rank == 0:
            record["cache"] = drop_page_cache([ckpt_root, dcp_dir])
        dist.barrier()
        start = time.time()
        if loader == "ckpt":
            _, stats = ckpt.load(ckpt_root, step=1, into=state, process_group=group, with_stats=True)
            record["bytes_read"], record["bytes_needed"] = stats["bytes_read"], stats["bytes_loaded"]
        else:
            dcp.load(state, checkpoint_id=dcp_dir)
        dist.barrier()
        record["load_s"] = time.time() - start
    write_result(record, out_path)
    sys.stdout.flush()
    os._exit(0)


def _run(phase, world, args, workdir):
    outs = [os.path.join(workdir, f"{phase}-w{world}-rank{r}.json") for r in range(world)]
    return run_ranks(_rank_main, world, lambda r: (phase, args, workdir), outs, args.timeout,
                     f"reshard bench, {phase} phase")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3, help="rounds per case, at least 3 (median)")
    ap.add_argument("--dcp-threads", type=int, default=4, help="DCP FileSystemWriter thread_count")
    ap.add_argument("--quick", action="store_true", help="a ~90 MiB state")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args()
    if args.quick:
        args.vocab, args.d, args.layers = 16000, 256, 4
    if args.repeat < 3:
        ap.error("--repeat must be at least 3")
    nbytes = 3 * 4 * sum(_numel(s) for s in shapes(args.vocab, args.d, args.layers).values())
    os.makedirs(args.dir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="reshard-", dir=args.dir)
    try:
        log(f"2 ranks save {nbytes / 2**20:.0f} MiB of DTensors (ckpt, then dcp.save)")
        saved = _run("save", 2, args, workdir)
        cases = {}
        for world in (1, 2):
            log(f"2 -> {world} rank(s): ckpt.load and dcp.load, cold, {args.repeat} rounds, "
                "each load in fresh processes, alternating order")
            times, reads, cache = {"ckpt": [], "dcp": []}, [], set()
            for rnd in range(args.repeat):
                for loader in (("ckpt", "dcp") if rnd % 2 == 0 else ("dcp", "ckpt")):
                    ranks = _run(f"load-{loader}", world, args, workdir)
                    times[loader].append(ranks[0]["load_s"])
                    cache.add(ranks[0].get("cache"))
                    if loader == "ckpt":
                        reads = ranks
            med = statistics.median
            ckpt_s, dcp_s = med(times["ckpt"]), med(times["dcp"])
            read = sum(r["bytes_read"] for r in reads)
            needed = sum(r["bytes_needed"] for r in reads)
            cases[f"2to{world}"] = {
                "ranks": world, "ckpt_load_s": round(ckpt_s, 3), "dcp_load_s": round(dcp_s, 3),
                "load_over_dcp_load": round(ckpt_s / dcp_s, 3),
                "ckpt_load_gbps": round(needed / ckpt_s / 1e9, 3),
                "bytes_read": read, "bytes_needed": needed,
                "bytes_read_over_needed": round(read / needed, 4),
                "ckpt_load_s_min_max": [round(min(times["ckpt"]), 3), round(max(times["ckpt"]), 3)],
                "dcp_load_s_min_max": [round(min(times["dcp"]), 3), round(max(times["dcp"]), 3)],
                "ckpt_load_s_all": [round(t, 3) for t in times["ckpt"]],
                "dcp_load_s_all": [round(t, 3) for t in times["dcp"]],
                "cache": sorted(c for c in cache if c)}
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    result = {
        "bench": "reshard",
        "bytes": nbytes,
        "load_over_dcp_load": max(c["load_over_dcp_load"] for c in cases.values()),
        "bytes_read_over_needed": max(c["bytes_read_over_needed"] for c in cases.values()),
        "ckpt_save_s": round(max(r["ckpt_save_s"] for r in saved), 3),
        "dcp_save_s": round(max(r["dcp_save_s"] for r in saved), 3),
        "dcp_threads": args.dcp_threads, "dcp_sync_files": True,
        "cases": cases,
    }
    print(json.dumps(result), flush=True)


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


if __name__ == "__main__":
    main()
