#!/usr/bin/env python3
"""distributed bench: a multi-rank checkpoint of --bytes (default 1 GiB) by
--ranks ranks on this machine (each its share, rank-local) against one rank
(a single-process checkpointer) writing the same bytes, in the same run.

Every rank is its own process on a gloo group over TCP (rank 0 hosts the
store), as `torchrun` would start them. Each one reserves (pre-faults) its
staging memory first, then saves once cold and --saves times steady (full
saves, delta none), all ranks starting each save together (a barrier, which
the training loop would have anyway). Per steady save:

  aggregate durable throughput = bytes / (last rank's commit - first rank's start)
  single-rank throughput       = bytes / (its commit - its start)
  commit latency               = rank 0's `commit_latency_s` (the engine's:
                                 last part durable -> committed); cross-checked
                                 from outside as rank 0's Wait returning minus
                                 the newest mtime of the rank manifests (each
                                 rank writes its own once its shards are fsynced)
  blocked                      = how long save_async held each rank

One JSON line (medians of the steady saves; the cold save apart):

    {"bench": "distributed", "ranks": 2, "bytes": ..., "aggregate_over_single_rank": ...,
     "commit_latency_s": ..., "blocked_s_per_rank": [...], ...}

    python3 bench/distributed_bench.py [--bytes N] [--ranks 2] [--saves 4] [--dir DIR] [--quick] [--keep]
"""
import argparse
import datetime
import glob
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_ranks import run_ranks, write_result  # noqa: E402

TENSOR_BYTES = 64 << 20


def log(msg):
    print(f"[distributed] {msg}", file=sys.stderr, flush=True)


def _state(nbytes, rank):
    import torch
    state, left, i = {}, nbytes, 0
    while left > 0:
        n = min(TENSOR_BYTES, left) // 4
        state[f"t{i:03d}"] = torch.full((n,), float(rank * 1000 + i))
        left -= n * 4
        i += 1
    return state


def _rank_main(rank, world, port, root, nbytes, saves, out_path):
    """One rank (world 1: the single-process baseline): the figures of each save."""
    import torch
    import torch.distributed as dist
    import ckpt
    group = None
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=900))
        group = dist.group.WORLD
    barrier = (lambda: dist.barrier()) if group is not None else (lambda: None)
    state = _state(nbytes, rank)
    records = []
    with ckpt.Checkpointer(root, process_group=group if group is not None else False,
                           commit_timeout_s=600, rank_local=True) as cp:
        cp.reserve(state, wait=True)
        for step in range(1, saves + 2):  # step 1 is the cold save
            for t in state.values():
                t[0] += 1.0
            barrier()
            start = time.time()
            resp = cp.save_async(step, state)
            blocked = time.time() - start
            stats = resp.result(timeout=900)
            done = time.time()
            rec = {"step": step, "start": start, "done": done, "blocked_s": blocked,
                   "seconds": stats["seconds"], "persist_s": stats["persist_s"],
                   "file_bytes": stats["file_bytes"], "backend": stats.get("backend"),
                   "commit_latency_s": stats.get("commit_latency_s"),
                   "ranks_wait_s": stats.get("ranks_wait_s")}
            barrier()  # every rank is done: the rank manifests are final
            if rank == 0:
                manifests = glob.glob(os.path.join(stats["dir"], "rank-*.MANIFEST.json"))
                if manifests:
                    rec["last_part_durable"] = max(os.stat(m).st_mtime for m in manifests)
                # Keep only the newest checkpoint (space): older ones are not needed.
                for old in glob.glob(os.path.join(root, "step-*")):
                    if os.path.abspath(old) != os.path.abspath(stats["dir"]):
                        shutil.rmtree(old, ignore_errors=True)
            barrier()
            records.append(rec)
    write_result(records, out_path)
    sys.stdout.flush()
    os._exit(0)


def _run(world, root, nbytes, saves, workdir, timeout):
    outs = [os.path.join(workdir, f"w{world}-rank{r}.json") for r in range(world)]
    return run_ranks(_rank_main, world, lambda r: (root, nbytes // world, saves), outs, timeout,
                     "distributed bench")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bytes", type=int, default=1 << 30)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--saves", type=int, default=4)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--quick", action="store_true", help="256 MiB, 3 steady saves")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args()
    if args.quick:
        args.bytes, args.saves = min(args.bytes, 256 << 20), min(args.saves, 3)
    os.makedirs(args.dir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="distributed-", dir=args.dir)
    try:
        log(f"one rank writing {args.bytes >> 20} MiB, {args.saves} steady saves")
        single = _run(1, os.path.join(workdir, "single"), args.bytes, args.saves, workdir, args.timeout)[0]
        log(f"{args.ranks} ranks writing {args.bytes >> 20} MiB together")
        ranks = _run(args.ranks, os.path.join(workdir, "multi"), args.bytes, args.saves, workdir,
                     args.timeout)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    def steady(records):
        return records[1:]

    single_gbps = [args.bytes / (r["done"] - r["start"]) / 1e9 for r in steady(single)]
    aggregate_gbps, latency, outside = [], [], []
    for i in range(1, len(ranks[0])):
        saves = [rank[i] for rank in ranks]
        span = max(s["done"] for s in saves) - min(s["start"] for s in saves)
        aggregate_gbps.append(args.bytes / span / 1e9)
        if ranks[0][i].get("commit_latency_s") is not None:
            latency.append(ranks[0][i]["commit_latency_s"])
        if "last_part_durable" in ranks[0][i]:
            outside.append(max(0.0, ranks[0][i]["done"] - ranks[0][i]["last_part_durable"]))
    if not latency:  # an engine without the figure
        latency = outside
    cold = [rank[0] for rank in ranks]
    med = statistics.median
    result = {
        "bench": "distributed",
        "ranks": args.ranks,
        "bytes": args.bytes,
        "saves": args.saves,
        "aggregate_gbps": round(med(aggregate_gbps), 3),
        "single_rank_gbps": round(med(single_gbps), 3),
        "aggregate_over_single_rank": round(med(aggregate_gbps) / med(single_gbps), 3),
        "commit_latency_s": round(med(latency), 4) if latency else None,
        "commit_latency_max_s": round(max(latency), 4) if latency else None,
        "commit_latency_outside_s": round(med(outside), 4) if outside else None,
        "ranks_wait_s_per_rank": [round(med(r["ranks_wait_s"] or 0 for r in steady(rank)), 4)
                                  for rank in ranks],
        "blocked_s_per_rank": [round(med(r["blocked_s"] for r in steady(rank)), 4) for rank in ranks],
        "single_rank_blocked_s": round(med(r["blocked_s"] for r in steady(single)), 4),
        "persist_s_per_rank": [round(med(r["persist_s"] for r in steady(rank)), 3) for rank in ranks],
        "cold_aggregate_gbps": round(args.bytes / (max(c["done"] for c in cold)
                                                   - min(c["start"] for c in cold)) / 1e9, 3),
        "cold_single_rank_gbps": round(args.bytes / (single[0]["done"] - single[0]["start"]) / 1e9, 3),
        "cold_blocked_s_per_rank": [round(c["blocked_s"], 4) for c in cold],
        "backend": ranks[0][0]["backend"],
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
