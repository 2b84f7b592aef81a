"""Running one bench phase as `world` rank processes (spawned, a fresh gloo
group each: rank 0 hosts the store on a free port), for the multi-rank
benches. Each rank writes its result as JSON to its own file and exits; the
phase fails, naming the rank, if one wrote none before the deadline.
"""
import json
import multiprocessing
import os
import socket
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_result(record, out_path):
    """What a rank's main ends with: its result, atomically, then exit."""
    with open(out_path + ".tmp", "w") as f:
        json.dump(record, f)
    os.rename(out_path + ".tmp", out_path)


def run_ranks(target, world, rank_args, outs, timeout, what):
    """Starts `target(rank, world, port, *rank_args(rank), outs[rank])` for
    every rank, waits at most `timeout` seconds for all, kills the rest, and
    returns the ranks' results in rank order. SystemExit naming `what` and
    the rank if one wrote no result."""
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, world, port, *rank_args(r), outs[r])) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
    results = []
    for r, path in enumerate(outs):
        if not os.path.exists(path):
            raise SystemExit(f"{what}: rank {r} of {world} wrote no result (exit code {procs[r].exitcode})")
        with open(path) as f:
            results.append(json.load(f))
    return results
