#!/usr/bin/env python3
"""restore bench: ckpt's cold restores against dcp.load and against the disk.

One GPT-style state (model + AdamW after real training steps, as peers_bench:
~1.4 GB; --quick ~240 MB), saved back to back, in this order, by: dcp.save
(FileSystemWriter, `--dcp-threads` writer threads, its default fsync), ckpt
(full), ckpt with float compression (`compression="floats"`) and, unless
--no-chain, 11 ckpt saves chained with exact deltas (`delta="exact",
full_every=11`, a real training step between saves). Then the page cache is
dropped.

Each round then runs every item below once, each in a fresh process:

  fio_direct     fio O_DIRECT sequential read of ckpt's shard files (1 MiB
                 blocks, queue depth 32, io_uring or libaio)
  buffered       a buffered sequential read of the same files (8 MiB reads)
  fio_direct_dcp, buffered_dcp: the same over DCP's files
  dcp_load       dcp.load(state) into a live state of the same shapes
  ckpt_load_into ckpt.load(root, into=state) into the same kind of state
  ckpt_load      ckpt.load(root): fresh tensors (what a restarted job without
                 pre-allocated tensors runs)
  ckpt_compressed_into, ckpt_newest_of_11_into: into= restores of the
                 compressed checkpoint and of the newest chained save
  ckpt_2ranks_once, ckpt_2ranks_each: 2 ranks (gloo, this machine) load one
                 replicated DDP-style checkpoint of the same state (written
                 by 2 ranks, model and optimizer replicated) into their
                 states with the group: read once for the group (each
                 replicated tensor read by one rank and broadcast) and,
                 with read_once=False, every rank reading all of it; the
                 time is from a barrier before to a barrier after

Before each timed call: the worker builds its destination state and pays its
loader's one-time set-up (imports, the extension, DCP's planner and reader on a
small checkpoint of its own) outside the timed call; then the page cache of
the files is dropped (drop_caches as root, else posix_fadvise DONTNEED; the
method is recorded per item: neither drops a hypervisor's cache). Rounds run
in a different order each time (rotated, every other round reversed), then
reordered so that no item reads the same files as the item just before it.

The limit L of a round is the faster of fio_direct and buffered over ckpt's
files, measured in that round. Figures are medians over rounds, with min and
max. Ratios:

  load_into_over_limit   L's time over ckpt_load_into's (fraction of the disk)
  fresh_load_over_limit  L's time over ckpt_load's
  load_into_over_dcp     ckpt_load_into's time over dcp_load's
  fresh_load_over_dcp    ckpt_load's time over dcp_load's
  compressed_load_over_raw         ckpt_compressed_into over ckpt_load_into
  newest_of_11_restore_over_full   ckpt_newest_of_11_into over ckpt_load_into
  replicated_bytes_read_over_size  bytes the 2 ranks read from the shard
                                   files (as the reader counts them), over
                                   the checkpoint's file bytes (read once)
  replicated_two_ranks_over_one    ckpt_2ranks_once over ckpt_load_into
  replicated_each_over_once        ckpt_2ranks_each over ckpt_2ranks_once

    python3 bench/restore_bench.py [--quick] [--rounds N] [--dir DIR] [--keep]
                                   [--no-chain] [--items LOAD,...]

Prints one JSON line {"bench": "restore", ...}; progress goes to stderr.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

from peers_bench import drop_page_cache, make_workload  # noqa: E402

LOADS = ["dcp_load", "ckpt_load_into", "ckpt_load", "ckpt_compressed_into", "ckpt_newest_of_11_into",
         "ckpt_2ranks_once", "ckpt_2ranks_each"]
RANKS = ["ckpt_2ranks_once", "ckpt_2ranks_each"]  # 2-rank loads of the replicated checkpoint
LIMITS = ["fio_direct", "buffered"]  # over ckpt's files: the limit L
DCP_LIMITS = ["fio_direct_dcp", "buffered_dcp"]  # the same over DCP's files
# The files each item reads (items reading the same files never run back to back).
FILES_OF = {"fio_direct": "ckpt", "buffered": "ckpt", "ckpt_load_into": "ckpt", "ckpt_load": "ckpt",
            "fio_direct_dcp": "dcp", "buffered_dcp": "dcp",
            "dcp_load": "dcp", "ckpt_compressed_into": "compressed", "ckpt_newest_of_11_into": "chain",
            "ckpt_2ranks_once": "ranks", "ckpt_2ranks_each": "ranks"}


def log(msg):
    print(f"[restore] {msg}", file=sys.stderr, flush=True)


def files_under(path):
    out = []
    for d, _, names in os.walk(path):
        out += [os.path.join(d, n) for n in sorted(names)]
    return out


def data_files(files):
    """The files of at least 1 MiB (the data, not manifests or metadata); all
    of them when none is that large (a smoke run's tiny state)."""
    large = [f for f in files if os.path.getsize(f) >= 1 << 20]
    return large or [f for f in files if os.path.getsize(f) > 0]


def shard_files(root):
    """The data files of ckpt's newest step under `root` (no manifests)."""
    steps = sorted(d for d in os.listdir(root) if d.startswith("step"))
    step_dir = os.path.join(root, steps[-1])
    return data_files(files_under(step_dir))


# -- writing (one process, back to back) --------------------------------------

def write_worker(args):
    import ckpt
    import torch.distributed.checkpoint as dcp
    workloads, w = make_workload(args.quick)
    for _ in range(2):  # AdamW state exists
        w.forward_backward()
        w.step()
    state = w.state()
    paths = {k: os.path.join(args.dir_run, k) for k in ("dcp", "ckpt", "compressed", "chain", "warm", "ranks")}
    t0 = time.perf_counter()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(paths["dcp"], thread_count=args.dcp_threads))
    log(f"dcp.save {time.perf_counter() - t0:.2f} s")
    for name, opts in (("ckpt", {}), ("compressed", {"compression": "floats"})):
        t0 = time.perf_counter()
        with ckpt.Checkpointer(paths[name], full_every=1, **opts) as cp:
            cp.save(0, state)
        log(f"ckpt save ({name}) {time.perf_counter() - t0:.2f} s")
    if not args.no_chain:
        with ckpt.Checkpointer(paths["chain"], delta="exact", full_every=11) as cp:
            for i in range(11):
                if i:
                    w.forward_backward()
                    w.step()
                cp.save(i, w.state())
        log("11 chained saves written")
    # Small checkpoints of each kind, for the loaders' one-time set-up.
    import torch
    tiny = {"w": torch.zeros(1024), "nested": {"b": torch.ones(16)}}
    dcp.save(tiny, storage_writer=dcp.FileSystemWriter(os.path.join(paths["warm"], "dcp")))
    with ckpt.Checkpointer(os.path.join(paths["warm"], "ckpt"), full_every=1) as cp:
        cp.save(0, tiny)
    ranks_s = run_ranks(args, ["--worker", "write_ranks", "--paths", json.dumps(paths)], args.worker_timeout)
    log(f"2-rank replicated save {max(r['seconds'] for r in ranks_s):.2f} s")
    os.sync()
    out = {"bytes": workloads.state_bytes(state), "tensors": len(list(workloads.tensors_of(state))),
           "paths": paths, "ckpt_file_bytes": sum(os.path.getsize(f) for f in shard_files(paths["ckpt"])),
           "dcp_file_bytes": sum(os.path.getsize(f) for f in files_under(paths["dcp"])),
           "ranks_file_bytes": sum(os.path.getsize(f) for f in shard_files(paths["ranks"]))}
    print(json.dumps(out), flush=True)


# -- two ranks on this machine -------------------------------------------------

def run_ranks(args, extra, timeout, world=2):
    """Runs this script's worker `extra` as `world` ranks of a fresh gloo
    group on 127.0.0.1; returns each rank's last JSON line."""
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    base = [sys.executable, os.path.abspath(__file__), "--dir-run", args.dir_run] + \
        (["--quick"] if args.quick else []) + extra
    procs = [subprocess.Popen(base + ["--rank", str(r), "--world", str(world), "--port", str(port)],
                              stdout=subprocess.PIPE, text=True) for r in range(world)]
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=timeout)
        if p.returncode != 0:
            for q in procs:
                q.kill()
            raise RuntimeError(f"rank worker {' '.join(extra)} exited {p.returncode}")
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


def _join(args):
    import datetime
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.world, timeout=datetime.timedelta(seconds=args.worker_timeout))
    return dist


def write_ranks_worker(args):
    """One rank of the 2-rank save of the same state, model and optimizer
    replicated (each rank writes about half), the RNG rank-local."""
    import torch
    import ckpt
    dist = _join(args)
    paths = json.loads(args.paths)
    _, w = make_workload(args.quick)
    for _ in range(2):  # the same steps on every rank: the same state, as DDP keeps it
        w.forward_backward()
        w.step()
    t0 = time.perf_counter()
    with ckpt.Checkpointer(paths["ranks"], full_every=1, replicated=["model", "optim"],
                           rank_local=["rng"]) as cp:
        cp.save(0, w.state())
    seconds = time.perf_counter() - t0
    with ckpt.Checkpointer(os.path.join(paths["warm"], "ranks"), full_every=1, replicated=["w"]) as cp:
        cp.save(0, {"w": torch.zeros(1024)})
    dist.barrier()
    print(json.dumps({"seconds": seconds}), flush=True)
    _leave()


def _leave():
    """Ends a rank at once: a gloo group torn down at interpreter exit while
    its peer is leaving too can abort the process (std::terminate)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _storage_read_bytes():
    """read_bytes of this process (/proc/self/io): bytes it made the block
    layer fetch (cache hits excluded), or None where the kernel has no I/O
    accounting."""
    try:
        with open("/proc/self/io") as f:
            return int(next(line for line in f if line.startswith("read_bytes:")).split()[1])
    except (OSError, StopIteration, ValueError):
        return None


def load_ranks_worker(args):
    """One rank of a 2-rank into= load with the group: its state built and
    the loader's set-up paid first, caches dropped by rank 0, then timed from
    a barrier to a barrier."""
    import torch
    import ckpt
    dist = _join(args)
    paths = json.loads(args.paths)
    _, w = make_workload(args.quick, seed=1)
    w.forward_backward()
    w.step()
    state = w.state()
    read_once = args.item == "ckpt_2ranks_once"
    ckpt.load(os.path.join(paths["warm"], "ranks"), into={"w": torch.empty(1024)}, process_group=dist.group.WORLD,
              read_once=read_once)
    drop = drop_page_cache([paths["ranks"]]) if args.rank == 0 else None
    dist.barrier()
    before = _storage_read_bytes()
    start = time.perf_counter()
    _, stats = ckpt.load(paths["ranks"], into=state, process_group=dist.group.WORLD, read_once=read_once,
                         with_stats=True)
    dist.barrier()
    seconds = time.perf_counter() - start
    after = _storage_read_bytes()
    print(json.dumps({"item": args.item, "drop": drop, "seconds": seconds,
                      "bytes_read": stats.get("bytes_read"), "bytes_received": stats.get("bytes_received"),
                      "storage_read_bytes": None if before is None else after - before}), flush=True)
    _leave()


def ranks_item(args, item, paths, timeout):
    """The 2-rank load `item`: the slower rank's time, both ranks' bytes."""
    got = run_ranks(args, ["--worker", "load_ranks", "--item", item, "--paths", json.dumps(paths)], timeout)
    storage = [g["storage_read_bytes"] for g in got]
    return {"item": item, "drop": got[0]["drop"], "seconds": max(g["seconds"] for g in got),
            "bytes_read": [g["bytes_read"] for g in got], "bytes_received": [g["bytes_received"] for g in got],
            "storage_read_bytes": None if None in storage else storage}


# -- one item, in a fresh process ---------------------------------------------

def load_worker(args):
    import warnings
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    paths = json.loads(args.paths)
    item = args.item
    if item in LIMITS + DCP_LIMITS:
        files = shard_files(paths["ckpt"]) if item in LIMITS else data_files(files_under(paths["dcp"]))
        drop = drop_page_cache(files)
        kind = "buffered" if item.startswith("buffered") else "fio_direct"
        return print(json.dumps({"item": item, "drop": drop, **measure_limit(kind, files)}), flush=True)
    import torch
    import ckpt
    import torch.distributed.checkpoint as dcp
    _, w = make_workload(args.quick, seed=1)  # other values: the load has to change them
    w.forward_backward()
    w.step()
    state = w.state()
    tiny = {"w": torch.empty(1024), "nested": {"b": torch.empty(16)}}
    # One-time set-up, outside the timed call: DCP's planner, reader and
    # metadata path; ckpt's extension and reader.
    dcp.load(tiny, checkpoint_id=os.path.join(paths["warm"], "dcp"))
    ckpt.load(os.path.join(paths["warm"], "ckpt"), into=tiny)
    root = {"ckpt_load_into": "ckpt", "ckpt_load": "ckpt", "ckpt_compressed_into": "compressed",
            "ckpt_newest_of_11_into": "chain", "dcp_load": "dcp"}[item]
    drop = drop_page_cache([paths[root]])
    start = time.perf_counter()
    if item == "dcp_load":
        dcp.load(state, checkpoint_id=paths["dcp"])
    elif item == "ckpt_load":
        loaded = ckpt.load(paths["ckpt"])
    else:
        ckpt.load(paths[root], into=state)
    seconds = time.perf_counter() - start
    print(json.dumps({"item": item, "drop": drop, "seconds": seconds}), flush=True)


def measure_limit(item, files):
    total = sum(os.path.getsize(f) for f in files)
    if item == "buffered":
        buf = bytearray(8 << 20)
        view = memoryview(buf)
        start = time.perf_counter()
        for f in files:
            with open(f, "rb", buffering=0) as fh:
                while fh.readinto(view):
                    pass
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "bytes": total}
    engine = "io_uring"
    cmd = ["fio", "--name=limit", "--rw=read", "--direct=1", "--bs=1M", "--iodepth=32",
           "--file_service_type=sequential", "--filename=" + ":".join(f.replace(":", "\\:") for f in files),
           "--output-format=json", "--ioengine=" + engine]
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:  # no io_uring in this kernel or fio: libaio
        cmd[-1] = "--ioengine=libaio"
        start = time.perf_counter()
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=True)
        engine = "libaio"
    wall = time.perf_counter() - start
    job = json.loads(proc.stdout)["jobs"][0]["read"]
    # fio's own clock (runtime, ms) excludes its start-up; the bytes it read.
    # A read shorter than its 1 ms resolution (a smoke run's files) counts
    # as half of it.
    seconds = job["runtime"] / 1000.0 if job["runtime"] > 0 else 0.0005
    return {"seconds": seconds, "bytes": job["io_bytes"], "wall_s": wall, "fio_engine": engine}


# -- the driver -----------------------------------------------------------------

def run(args, extra, timeout):
    cmd = [sys.executable, os.path.abspath(__file__), "--dir-run", args.dir_run] + \
        (["--quick"] if args.quick else []) + extra
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {' '.join(extra)} exited {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def round_order(items, r, prev=None):
    """Round r's order: rotated by r, reversed every other round, then no item
    right after another that reads the same files (where the set allows),
    `prev` being the item run last before the round."""
    order = items[r % len(items):] + items[:r % len(items)]
    if r % 2:
        order.reverse()
    out = []
    while order:
        last = out[-1] if out else prev
        allowed = [i for i in order if last is None or FILES_OF[i] != FILES_OF[last]] or order
        # Of those, one whose files are still read most often (so that no
        # group is left to run back to back at the end).
        left = {g: sum(FILES_OF[i] == g for i in order) for g in set(FILES_OF[i] for i in order)}
        pick = max(allowed, key=lambda i: (left[FILES_OF[i]], -order.index(i)))
        order.remove(pick)
        out.append(pick)
    return out


def spread(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "all": xs} if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="~240 MB of state instead of ~1.4 GB")
    ap.add_argument("--dir", help="where to write (default: a temp dir under $TMPDIR)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every item (at least 3)")
    ap.add_argument("--dcp-threads", type=int, default=4, help="DCP FileSystemWriter thread_count")
    ap.add_argument("--no-chain", action="store_true", help="skip the 11 chained saves")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--items", help="only these loads (comma-separated; the limits always run)")
    ap.add_argument("--worker-timeout", type=float, default=1800)
    ap.add_argument("--worker", choices=["write", "load", "write_ranks", "load_ranks"], help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--item", help=argparse.SUPPRESS)
    ap.add_argument("--paths", help=argparse.SUPPRESS)
    ap.add_argument("--dir-run", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker == "write":
        return write_worker(args)
    if args.worker == "load":
        return load_worker(args)
    if args.worker == "write_ranks":
        return write_ranks_worker(args)
    if args.worker == "load_ranks":
        return load_ranks_worker(args)
    if args.rounds < 3:
        ap.error("--rounds must be at least 3")

    import torch
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    args.dir_run = tempfile.mkdtemp(prefix="restore.", dir=args.dir or os.environ.get("TMPDIR"))
    r = {"bench": "restore", "quick": args.quick, "torch_version": torch.__version__, "rounds": args.rounds,
         "dcp_threads": args.dcp_threads, "load_uptime": open("/proc/loadavg").read().split()[:3]}
    try:
        log("writing: dcp, ckpt, ckpt compressed, 11 chained")
        written = run(args, ["--worker", "write", "--dcp-threads", str(args.dcp_threads)] +
                      (["--no-chain"] if args.no_chain else []), args.worker_timeout)
        r.update({k: written[k] for k in ("bytes", "tensors", "ckpt_file_bytes", "dcp_file_bytes",
                                          "ranks_file_bytes")})
        wanted = LOADS if not args.items else args.items.split(",")
        unknown = sorted(set(wanted) - set(LOADS))
        if unknown:
            raise SystemExit(f"--items: no such load {unknown}; the loads are {LOADS}")
        items = LIMITS + DCP_LIMITS + [i for i in LOADS if i in wanted and not (
            args.no_chain and i == "ckpt_newest_of_11_into")]
        times = {i: [] for i in items}
        limit_s, drops, orders = [], {i: set() for i in items}, []
        ranks_read = {i: [] for i in RANKS}
        for rnd in range(args.rounds):
            order = round_order(items, rnd, orders[-1][-1] if orders else None)
            orders.append(order)
            got = {}
            for item in order:
                if item in RANKS:
                    res = ranks_item(args, item, written["paths"], args.worker_timeout)
                    ranks_read[item].append(res)
                else:
                    res = run(args, ["--worker", "load", "--item", item, "--paths", json.dumps(written["paths"])],
                              args.worker_timeout)
                got[item] = res
                times[item].append(res["seconds"])
                drops[item].add(res["drop"])
                log(f"round {rnd} {item}: {res['seconds']:.3f} s")
            # L: the faster of the two reads of ckpt's files, scaled to its file bytes.
            limit_s.append(min(got[i]["seconds"] * written["ckpt_file_bytes"] / got[i]["bytes"] for i in LIMITS))
    finally:
        if args.keep:
            log(f"kept {args.dir_run}")
        else:
            shutil.rmtree(args.dir_run, ignore_errors=True)

    med = {i: statistics.median(v) for i, v in times.items() if v}
    lim = statistics.median(limit_s)

    def over(a, b):
        return a / b if a is not None and b else None

    r.update({
        "orders": orders, "cache_drop": {i: sorted(d) for i, d in drops.items()},
        "seconds": {i: spread(v) for i, v in times.items()},
        "limit_s": spread(limit_s), "limit_gbps": written["ckpt_file_bytes"] / lim / 1e9,
        "fio_direct_gbps": written["ckpt_file_bytes"] / med["fio_direct"] / 1e9,
        "buffered_gbps": written["ckpt_file_bytes"] / med["buffered"] / 1e9,
        "dcp_fio_direct_gbps": written["dcp_file_bytes"] / med["fio_direct_dcp"] / 1e9,
        "dcp_buffered_gbps": written["dcp_file_bytes"] / med["buffered_dcp"] / 1e9,
        "load_into_over_limit": over(lim, med.get("ckpt_load_into")),
        "fresh_load_over_limit": over(lim, med.get("ckpt_load")),
        "load_into_over_dcp": over(med.get("ckpt_load_into"), med.get("dcp_load")),
        "fresh_load_over_dcp": over(med.get("ckpt_load"), med.get("dcp_load")),
        "compressed_load_over_raw": over(med.get("ckpt_compressed_into"), med.get("ckpt_load_into")),
        "newest_of_11_restore_over_full": over(med.get("ckpt_newest_of_11_into"), med.get("ckpt_load_into")),
        "replicated_bytes_read_over_size": over(statistics.median(
            [sum(x["bytes_read"]) for x in ranks_read["ckpt_2ranks_once"]]), written["ranks_file_bytes"])
        if ranks_read["ckpt_2ranks_once"] else None,
        "replicated_two_ranks_over_one": over(med.get("ckpt_2ranks_once"), med.get("ckpt_load_into")),
        "replicated_each_over_once": over(med.get("ckpt_2ranks_each"), med.get("ckpt_2ranks_once")),
        "ranks_bytes": {i: [{k: x[k] for k in ("bytes_read", "bytes_received", "storage_read_bytes")}
                            for x in v] for i, v in ranks_read.items()},
    })
    print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
