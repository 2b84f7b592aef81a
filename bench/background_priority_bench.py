#!/usr/bin/env python3
"""background_priority bench: what a persisting save costs a CPU-bound training loop.

A separate "training" process runs steps of 2-thread matmuls (torch, preferring
the `python3` on PATH, e.g. the PyPI build) and stamps each step. Meanwhile
this process saves a state of --mb MB with a Checkpointer, first full then
exact deltas, with background_nice 0 and with 10 (what an engine that encodes gets by default). For each
(mode, nice) it reports the median time of steps that ran while a save was in
flight / the median of steps with nothing in flight, and the saves' durable
times. One JSON line per (mode, nice) and a summary line:

    {"bench": "background_priority", "delta_step_slowdown_nice0": ...,
     "delta_step_slowdown_nice10": ..., ...}

    python3 bench/background_priority_bench.py [--mb 384] [--dir DIR]
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

TRAINER = r"""
import sys, time, torch
torch.set_num_threads(2)
a = torch.randn(1536, 1536)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    t = time.perf_counter()
    for _ in range(8): a @ a
    print(f"{time.time():.3f} {time.perf_counter() - t:.4f}", flush=True)
"""


def trainer_python():
    for exe in (shutil.which("python3"), "/usr/bin/python3"):
        if exe and subprocess.run([exe, "-c", "import torch"], capture_output=True).returncode == 0:
            return exe
    raise SystemExit("background_priority: no python3 with torch for the training process")


def run(ckpt, torch, state, directory, mode, nice, python):
    root = tempfile.mkdtemp(dir=directory)
    cp = ckpt.Checkpointer(os.path.join(root, "r"), delta=mode, full_every=1000, background_nice=nice)
    cp.reserve(state, wait=True)
    cp.save(1, state)
    trainer = subprocess.Popen([python, "-c", TRAINER, "16"], stdout=subprocess.PIPE, text=True)
    time.sleep(4)  # idle steps first
    windows = []
    for step in range(2, 5):
        for t in state.values():
            t.add_(1e-3)
        start = time.time()
        stats = cp.save_async(step, state).result(timeout=600)
        windows.append((start, time.time(), stats["seconds"], stats["kind"]))
        time.sleep(1.0)
    lines = trainer.communicate()[0].split("\n")
    cp.close()
    shutil.rmtree(root, ignore_errors=True)
    steps = [tuple(map(float, line.split())) for line in lines if line]
    inside = lambda ts: any(a <= ts <= b for a, b, _, _ in windows)  # noqa: E731
    during = [dt for ts, dt in steps if inside(ts)]
    idle = [dt for ts, dt in steps if not inside(ts)]
    return {"bench": "background_priority_case", "mode": mode, "nice": nice,
            "step_idle_s": statistics.median(idle),
            "step_during_save_s": statistics.median(during) if during else None,
            "step_slowdown": statistics.median(during) / statistics.median(idle) if during else None,
            "steps_during_save": len(during), "save_s": [round(w[2], 3) for w in windows],
            "kinds": [w[3] for w in windows]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=384)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    import torch
    import ckpt
    python = trainer_python()
    n = max(1, args.mb // 16)
    state = {f"layers.{i}.weight": torch.randn(4 << 20) for i in range(n)}
    summary = {"bench": "background_priority", "bytes": sum(t.numel() * 4 for t in state.values()),
               "trainer_python": python}
    for mode in ("exact", "none"):
        for nice in (0, 10):
            case = run(ckpt, torch, state, args.dir, mode, nice, python)
            print(json.dumps(case), flush=True)
            key = "delta" if mode == "exact" else "full"
            summary[f"{key}_step_slowdown_nice{nice}"] = case["step_slowdown"]
            summary[f"{key}_save_s_nice{nice}"] = case["save_s"]
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    sys.exit(main())
