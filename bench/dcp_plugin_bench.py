#!/usr/bin/env python3
"""dcp_plugin bench: torch.distributed.checkpoint through ckpt vs DCP's own files.

The same calls -- dcp.save, dcp.async_save (thread checkpointer, DCP's default
staging), dcp.load -- on a GPT-style training state (token embedding, blocks
of attention + MLP weights, untied head, AdamW's exp_avg and exp_avg_sq after
a step: ~1.1 GB; --quick ~190 MB), once with DCP's FileSystemWriter/Reader
(thread_count=T, sync_files=True) and once with ckpt.dcp.StorageWriter/Reader
(thread_count=T: its staging threads; writes go through io_uring). Each side
runs in a fresh process per round (so neither inherits the other's page cache,
allocator or staging memory), the sides alternate, >= 3 rounds; medians.

Per round and side (after one dcp.save that warms the process up: its time,
first_durable_s, is reported apart):
  durable   dcp.save(...) from call to return: the checkpoint is on disk
            (FileSystemWriter fsyncs its files; ckpt commits atomically).
  blocked   the process's second dcp.async_save(...) from call to return
            (what the training loop waits for: the staging copy, then the
            hand-off), its upload awaited before anything else. Without an
            async_stager DCP stages through the storage writer when it is an
            AsyncStager (ckpt's is: it reuses its CPU buffers), else through a
            DefaultStager made for that save (fresh memory each time).
            blocked_dcp_stager_s: the same call with DCP's DefaultStager passed
            in on both sides (first_blocked_s: the process's first).
  load      dcp.load(...) into the live state, the checkpoint's files first
            evicted from the page cache (posix_fadvise DONTNEED).
  native    (ckpt side only) ckpt.Checkpointer.save_async of the same state,
            its pool warm: blocked (one staging copy) and durable times, what
            DCP's interface costs over ckpt's own API (DCP's async_save copies
            the state into its staging memory, then ckpt copies it again).

Prints {"bench": "dcp_plugin", "durable_over_dcp_fs": ckpt/fs, "load_over_dcp_fs": ...,
"blocked_over_dcp_fs": ..., plus the medians in seconds and every round}; targets
(issue 35): durable <= 0.7, load <= 0.8, blocked <= 1.05.

    python3 bench/dcp_plugin_bench.py [--quick] [--dir DIR] [--rounds N] [--threads T]
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

TARGETS = {"durable_over_dcp_fs": 0.7, "load_over_dcp_fs": 0.8, "blocked_over_dcp_fs": 1.05}


def log(msg):
    print(f"[dcp_plugin] {msg}", file=sys.stderr, flush=True)


def make_state(torch, quick):
    """GPT-style model weights plus AdamW moments (fp32), a step counter and an
    LR value (non-tensor items, as DCP saves them: BytesIO)."""
    vocab, d, blocks = (8192, 384, 4) if quick else (32768, 768, 8)
    g = torch.Generator().manual_seed(0)
    model = {"tok.weight": torch.randn(vocab, d, generator=g)}
    for i in range(blocks):
        p = f"blocks.{i}."
        model[p + "attn.qkv.weight"] = torch.randn(3 * d, d, generator=g)
        model[p + "attn.out.weight"] = torch.randn(d, d, generator=g)
        model[p + "mlp.up.weight"] = torch.randn(4 * d, d, generator=g)
        model[p + "mlp.down.weight"] = torch.randn(d, 4 * d, generator=g)
        model[p + "ln1.weight"] = torch.ones(d)
        model[p + "ln2.weight"] = torch.ones(d)
    model["head.weight"] = torch.randn(vocab, d, generator=g)
    optim = {name: {"exp_avg": t * 1e-3, "exp_avg_sq": t * t * 1e-6,
                    "step": torch.tensor(100.0)} for name, t in model.items()}
    return {"model": model, "optim": {"state": optim, "lr": 3e-4}, "step": 100}


def evict(path):
    for dirpath, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def one_side(args):
    """Runs in a fresh process: save, async_save and load on one side."""
    import torch
    import torch.distributed.checkpoint as dcp
    state = make_state(torch, args.quick)
    nbytes = sum(t.numel() * t.element_size() for t in _tensors(state))
    base = args.side_dir
    if args.side == "ckpt":
        import ckpt.dcp
        writer = ckpt.dcp.StorageWriter(base, thread_count=args.threads)
        where = {s: base for s in range(5)}
        ids = {s: s for s in range(5)}
        reader = lambda: ckpt.dcp.StorageReader(base, step=1)  # noqa: E731
    else:
        where = {s: os.path.join(base, str(s)) for s in range(5)}
        ids = where
        writer = None
        reader = lambda: dcp.FileSystemReader(where[1])  # noqa: E731

    def fs_writer(step):
        return dcp.FileSystemWriter(where[step], thread_count=args.threads, sync_files=True)

    out = {"side": args.side, "tensor_bytes": nbytes}
    # The process's first save (page faults of fresh buffers, ckpt's staging
    # pool), reported apart; the loop's saves are the ones after it.
    start = time.perf_counter()
    dcp.save(state, storage_writer=writer or fs_writer(0), checkpoint_id=ids[0])
    out["first_durable_s"] = time.perf_counter() - start
    # durable: dcp.save
    start = time.perf_counter()
    dcp.save(state, storage_writer=writer or fs_writer(1), checkpoint_id=ids[1])
    out["durable_s"] = time.perf_counter() - start
    # blocked: dcp.async_save (thread checkpointer), the second one of the
    # process (a loop's steady state); then with DCP's own stager passed in.
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    for step, key, stager in ((2, "first_blocked_s", None), (3, "blocked_s", None),
                              (4, "blocked_dcp_stager_s",
                               DefaultStager(StagingOptions(False, False, False, False)))):
        kwargs = {} if stager is None else {"async_stager": stager}
        start = time.perf_counter()
        future = dcp.async_save(state, storage_writer=writer or fs_writer(step),
                                checkpoint_id=ids[step], **kwargs)
        out[key] = time.perf_counter() - start
        getattr(future, "upload_completion", future).result()
        if stager is not None:
            stager.close()
        if step == 3:
            out["async_total_s"] = time.perf_counter() - start
    # load: into the live state, cold
    target = make_state(torch, args.quick)
    for t in _tensors(target):
        t.zero_()
    evict(base)
    start = time.perf_counter()
    dcp.load(target, storage_reader=reader())
    out["load_s"] = time.perf_counter() - start
    same = all(torch.equal(a, b) for a, b in zip(_tensors(state), _tensors(target)))
    out["loaded_equal"] = bool(same)
    if args.side == "ckpt":
        out["staging_reused"] = writer._staging.reused  # async_saves that reused kept buffers
        ckpt.dcp.close_all()
        # ckpt's own API on the same state, for what DCP's interface costs:
        # save_async returns after ckpt's one staging copy (no DCP staging).
        import ckpt as native
        with native.Checkpointer(os.path.join(base, "native"), staging_threads=args.threads) as cp:
            cp.save(0, state)  # (allocates the staging pool, as DCP's stager did its copy)
            start = time.perf_counter()
            resp = cp.save_async(1, state)
            out["native_blocked_s"] = time.perf_counter() - start
            resp.result()
            out["native_durable_s"] = time.perf_counter() - start
    print(json.dumps(out), flush=True)


def _tensors(state):
    out = []

    def walk(v):
        if hasattr(v, "numel"):
            out.append(v)
        elif isinstance(v, dict):
            for k in sorted(v, key=str):
                walk(v[k])
    walk(state)
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dir", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--side", choices=["dcp_fs", "ckpt"], help=argparse.SUPPRESS)
    parser.add_argument("--side-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        return one_side(args)
    base = args.dir or tempfile.mkdtemp(prefix="dcp_plugin_")
    os.makedirs(base, exist_ok=True)
    rounds = {"dcp_fs": [], "ckpt": []}
    try:
        for r in range(max(3, args.rounds)):
            order = ("dcp_fs", "ckpt") if r % 2 == 0 else ("ckpt", "dcp_fs")
            for side in order:
                side_dir = os.path.join(base, f"{side}-{r}")
                cmd = [sys.executable, os.path.abspath(__file__), "--side", side, "--side-dir",
                       side_dir, "--threads", str(args.threads)] + (["--quick"] if args.quick else [])
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
                if proc.returncode != 0:
                    raise SystemExit(f"[dcp_plugin] {side} round {r} failed:\n{proc.stderr[-4000:]}")
                got = json.loads(proc.stdout.strip().splitlines()[-1])
                if not got["loaded_equal"]:
                    raise SystemExit(f"[dcp_plugin] {side} round {r}: the load differs from the save")
                rounds[side].append(got)
                log(f"round {r} {side}: durable {got['durable_s']:.2f}s blocked "
                    f"{got['blocked_s']:.3f}s load {got['load_s']:.2f}s")
                shutil.rmtree(side_dir, ignore_errors=True)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    med = {side: {k: statistics.median(x[k] for x in rs)
                  for k in ("first_durable_s", "durable_s", "first_blocked_s", "blocked_s",
                            "blocked_dcp_stager_s", "load_s", "async_total_s",
                            "native_blocked_s", "native_durable_s") if k in rs[0]}
           for side, rs in rounds.items()}
    result = {"bench": "dcp_plugin", "quick": args.quick, "threads": args.threads,
              "tensor_bytes": rounds["ckpt"][0]["tensor_bytes"], "rounds": len(rounds["ckpt"])}
    for key, metric in (("durable", "durable_s"), ("load", "load_s"), ("blocked", "blocked_s"),
                        ("blocked_dcp_stager", "blocked_dcp_stager_s")):
        result[f"{key}_over_dcp_fs"] = round(med["ckpt"][metric] / med["dcp_fs"][metric], 3)
    result["medians_s"] = med
    result["meets_targets"] = {k: result[k] <= v for k, v in TARGETS.items()}
    result["all_rounds"] = rounds
    print(json.dumps(result))


if __name__ == "__main__":
    main()
