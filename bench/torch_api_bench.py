#!/usr/bin/env python3
"""torch_api bench: how long a training loop is blocked by a checkpoint.

Builds a transformer-like state dict (~1.2 GB of float32/bfloat16 tensors;
--quick: ~256 MB) and, in one process, times:

  copy_       copying every tensor into pre-allocated tensors (the floor for
              any snapshot that lets training continue),
  torch.save  of the same state to a file in --dir (serialize + write; no fsync),
  ckpt        ckpt.Checkpointer.save_async of the same state, measured from the
              call to its return: eager (default; the tensors are staged, i.e.
              copied and hashed, when it returns) and lazy=True (it returns at
              once; the copy runs in the background and the caller waits for
              staging_completion before its optimizer step, which a training
              loop overlaps with forward/backward). Writing, fsync and commit
              run in the background. Each rep waits for the previous commit
              first, so no save waits for staging memory; one warm-up save per
              mode allocates the staging pool beforehand.

Prints one JSON line {"bench": "torch_api", ...} on stdout (medians in
seconds, all reps, the ratios and whether they meet the targets: torch.save /
ckpt >= 30 and eager ckpt / copy_ <= 1.25); progress goes to stderr.

    python3 bench/torch_api_bench.py [--quick] [--dir DIR] [--reps N]

Needs the ckpt package: installed, or PYTHONPATH=torch_ext/python with a build
tree (the package finds build*/torch_ext/_ckpt_torch.so, or CKPT_TORCH_EXT_LIB).
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

TARGET_TORCH_SAVE_OVER_CKPT = 30.0
TARGET_CKPT_OVER_COPY = 1.25


def log(msg):
    print(f"[torch_api] {msg}", file=sys.stderr, flush=True)


def make_state(torch, layers, d_model):
    """A decoder-only transformer's state: per layer qkv/out/up/down (fp32) and
    norms; embeddings in bf16. About 50 MB per layer at d_model=1024."""
    g = torch.Generator().manual_seed(0)
    state = {"embed.weight": torch.randn(8192, d_model, generator=g).to(torch.bfloat16)}
    for i in range(layers):
        p = f"layers.{i}."
        state[p + "attn.qkv.weight"] = torch.randn(3 * d_model, d_model, generator=g)
        state[p + "attn.out.weight"] = torch.randn(d_model, d_model, generator=g)
        state[p + "mlp.up.weight"] = torch.randn(4 * d_model, d_model, generator=g)
        state[p + "mlp.down.weight"] = torch.randn(d_model, 4 * d_model, generator=g)
        state[p + "norm1.weight"] = torch.ones(d_model)
        state[p + "norm2.weight"] = torch.ones(d_model)
    state["head.weight"] = torch.randn(8192, d_model, generator=g).to(torch.bfloat16)
    return {"model": state, "step": 1000, "note": "torch_api bench"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="~256 MB instead of ~1.2 GB")
    ap.add_argument("--dir", help="where to write (default: a temp dir under $TMPDIR), removed at the end")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--layers", type=int, help="override the state size (about 50 MB per layer)")
    ap.add_argument("--keep", action="store_true", help="keep the files written")
    args = ap.parse_args()

    import torch
    import ckpt

    layers = args.layers or (4 if args.quick else 23)
    state = make_state(torch, layers, 1024)
    tensors = list(state["model"].values())
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    log(f"state: {len(tensors)} tensors, {nbytes / 1e9:.3f} GB; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; ckpt extension {ckpt.library_path()}")
    base = args.dir or tempfile.mkdtemp(prefix="ckpt-torch-api-", dir=os.environ.get("TMPDIR"))
    os.makedirs(base, exist_ok=True)
    root = os.path.join(base, "ckpt")
    result = {"bench": "torch_api", "quick": args.quick, "state_bytes": nbytes, "tensors": len(tensors),
              "reps": args.reps, "torch_version": torch.__version__, "torch_threads": torch.get_num_threads()}
    try:
        # copy_: into tensors allocated (and faulted in) beforehand.
        dst = [torch.empty_like(t) for t in tensors]
        for d in dst:
            d.fill_(0)
        copy_s = []
        for _ in range(args.reps + 1):
            start = time.perf_counter()
            for d, s in zip(dst, tensors):
                d.copy_(s)
            copy_s.append(time.perf_counter() - start)
        copy_s = copy_s[1:]  # the first pass warms caches
        del dst
        log(f"copy_: {fmt(copy_s)}")

        # ckpt, eager then lazy: one warm-up save sizes the staging pool, then timed reps.
        runs = {}
        for mode in ("eager", "lazy"):
            blocked, staged, stats = [], [], []
            mode_root = f"{root}-{mode}"
            with ckpt.Checkpointer(mode_root, lazy=(mode == "lazy")) as cp:
                cp.save(0, state)
                for rep in range(1, args.reps + 1):
                    start = time.perf_counter()
                    resp = cp.save_async(rep, state)
                    blocked.append(time.perf_counter() - start)
                    resp.staging_completion.result()
                    staged.append(time.perf_counter() - start)
                    stats.append(resp.result())
                backend = cp.backend
            shutil.rmtree(mode_root, ignore_errors=True)
            runs[mode] = (blocked, staged, stats)
            log(f"ckpt save_async ({mode}): {fmt(blocked)}; staged after {fmt(staged)}; persisted at "
                f"{statistics.median(s['persist_gbps'] for s in stats):.2f} GB/s ({backend})")
        ckpt_s, _, stats = runs["eager"]
        lazy_s, lazy_staged_s, _ = runs["lazy"]

        # torch.save of the same state, same disk.
        path = os.path.join(base, "torch_save.pt")
        torch_s = []
        for _ in range(args.reps):
            start = time.perf_counter()
            torch.save(state, path)
            torch_s.append(time.perf_counter() - start)
            os.remove(path)
        log(f"torch.save: {fmt(torch_s)}")
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(base, ignore_errors=True)

    ckpt_med, lazy_med, copy_med, torch_med = (statistics.median(x) for x in (ckpt_s, lazy_s, copy_s, torch_s))
    over_ckpt = torch_med / ckpt_med
    over_lazy = torch_med / max(lazy_med, 1e-9)
    over_copy = ckpt_med / copy_med
    result.update({
        "ckpt_blocked_s": ckpt_med, "ckpt_lazy_blocked_s": lazy_med,
        "ckpt_lazy_staged_s": statistics.median(lazy_staged_s),
        "copy_s": copy_med, "torch_save_s": torch_med,
        "ckpt_blocked_all_s": ckpt_s, "ckpt_lazy_blocked_all_s": lazy_s, "copy_all_s": copy_s,
        "torch_save_all_s": torch_s,
        "ckpt_library_blocked_s": statistics.median(s["blocked_s"] for s in stats),
        "ckpt_staging_s": statistics.median(s["staging_s"] for s in stats),
        "ckpt_persist_gbps": statistics.median(s["persist_gbps"] for s in stats),
        "ckpt_commit_s": statistics.median(s["seconds"] for s in stats),
        "backend": backend,
        "torch_save_over_ckpt": over_ckpt, "torch_save_over_ckpt_lazy": over_lazy,
        "ckpt_over_copy": over_copy,
        "targets": {"torch_save_over_ckpt_min": TARGET_TORCH_SAVE_OVER_CKPT,
                    "ckpt_over_copy_max": TARGET_CKPT_OVER_COPY},
        "meets_torch_save_target": {"eager": over_ckpt >= TARGET_TORCH_SAVE_OVER_CKPT,
                                    "lazy": over_lazy >= TARGET_TORCH_SAVE_OVER_CKPT},
        "meets_copy_target": over_copy <= TARGET_CKPT_OVER_COPY,
    })
    log(f"blocked: ckpt eager {ckpt_med * 1e3:.1f} ms, lazy {lazy_med * 1e3:.2f} ms, copy_ "
        f"{copy_med * 1e3:.1f} ms, torch.save {torch_med * 1e3:.0f} ms -> torch.save/ckpt "
        f"{over_ckpt:.1f}x eager, {over_lazy:.0f}x lazy (target >= {TARGET_TORCH_SAVE_OVER_CKPT:g}); "
        f"ckpt eager/copy_ {over_copy:.2f}x (target <= {TARGET_CKPT_OVER_COPY})")
    print(json.dumps(result), flush=True)
    return 0


def fmt(xs):
    return "median %.1f ms (%s)" % (1e3 * statistics.median(xs), ", ".join(f"{1e3 * x:.1f}" for x in xs))


if __name__ == "__main__":
    sys.exit(main())
