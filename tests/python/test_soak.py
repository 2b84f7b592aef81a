"""Soak: many saves of a ~50 MB state (exact deltas, full_every=10) with
`ckpt-retain` run beside the open writer every 25 saves. Host memory, open
file descriptors and threads must not grow with the number of saves (memory
growth per save is a leading complaint about other checkpoint libraries), no
temp directory may be left, and every checkpoint retention kept verifies.

CKPT_SOAK_SAVES: 100 by default (~30 s); the `python_soak_slow` ctest runs
500, comparing RSS after save 100 and after the last save (< 2 %).
"""
import os
import subprocess

import pytest
import torch

import ckpt

SAVES = int(os.environ.get("CKPT_SOAK_SAVES", "100"))
RETAIN_EVERY = 25


def proc_rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise KeyError("VmRSS")


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def threads():
    """(threads of the process, io_uring kernel workers among them).

    The kernel starts io_uring's "iou-wrk-*" workers for blocking work (a
    buffered write, an fsync) and ends them once idle, so how many are alive
    at a given moment depends on timing and load, not on ckpt."""
    total = workers = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:  # ended meanwhile
            continue
        total += 1
        workers += name.startswith("iou-")
    return total - workers, workers


@pytest.fixture(scope="module")
def ckpt_retain(ckpt_restore):
    path = os.path.join(os.path.dirname(ckpt_restore), "ckpt-retain")
    if not os.path.exists(path):
        pytest.skip("ckpt-retain not built")
    return path


def make_state():
    g = torch.Generator().manual_seed(7)
    model = {f"layers.{i}.{kind}": torch.randn(shape, generator=g)
             for i in range(6) for kind, shape in (("attn.w", (512, 1024)), ("mlp.w", (1024, 512)),
                                                  ("norm.weight", (1024,)))}
    model["embed.weight"] = torch.randn(6144, 1024, generator=g)
    return {"model": model, "step": 0, "lr": 1e-3}


def train_step(state, step):
    """Changes ~1 % of every weight in place, as an optimizer step would
    (without allocating anything that lives on)."""
    with torch.no_grad():
        for t in state["model"].values():
            flat = t.view(-1)
            at = (step * 7919) % max(1, flat.numel() - flat.numel() // 100)
            flat[at:at + flat.numel() // 100].add_(0.001)
    state["step"] = step
    state["lr"] = 1e-3 / (1 + step)


def test_soak_memory_fds_and_threads_stay_flat(tmp_path, ckpt_restore, ckpt_retain):
    root = str(tmp_path / "root")
    state = make_state()
    nbytes = sum(t.numel() * t.element_size() for t in state["model"].values())
    assert 40 << 20 < nbytes < 80 << 20
    baseline_at = 100 if SAVES >= 500 else RETAIN_EVERY
    samples = {}
    retain_runs = 0
    with ckpt.Checkpointer(root, delta="exact", full_every=10) as cp:
        for step in range(1, SAVES + 1):
            train_step(state, step)
            resp = cp.save_async(step, state)
            resp.result()
            if step % RETAIN_EVERY == 0:
                proc = subprocess.run([ckpt_retain, "--root", root, "--keep-last", "5",
                                       "--keep-every", "50"], capture_output=True, text=True,
                                      timeout=300)
                assert proc.returncode == 0, proc.stderr
                retain_runs += 1
            if step in (baseline_at, SAVES):
                samples[step] = (proc_rss(), open_fds(), threads())
    (rss0, fds0, thr0), (rss1, fds1, thr1) = samples[baseline_at], samples[SAVES]
    print(f"\nsoak: {SAVES} saves of {nbytes / 1e6:.0f} MB, {retain_runs} retention runs; "
          f"RSS {rss0 / 1e6:.1f} MB after save {baseline_at}, {rss1 / 1e6:.1f} MB after save {SAVES} "
          f"({(rss1 - rss0) / rss0 * 100:+.2f} %); fds {fds0} -> {fds1}; threads {thr0[0]} -> {thr1[0]}, "
          f"io_uring workers {thr0[1]} -> {thr1[1]}")
    assert abs(rss1 - rss0) < 0.02 * rss0, f"RSS grew from {rss0} to {rss1} bytes"
    assert fds1 <= fds0, f"open descriptors grew from {fds0} to {fds1}"
    assert thr1[0] <= thr0[0], f"threads (io_uring workers aside) grew from {thr0[0]} to {thr1[0]}"
    # io_uring workers belong to a ring and end with it: a leaked ring would
    # show as a leaked descriptor above.
    names = os.listdir(root)
    assert not [n for n in names if n.startswith((".tmp-", ".trash-"))], names
    steps = sorted(int(n[len("step-"):]) for n in names if n.startswith("step-"))
    assert steps[-1] == SAVES and SAVES - 4 in steps, steps  # keep-last 5 (chains may keep more)
    proc = subprocess.run([ckpt_restore, "--root", root, "--list", "--verify"], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = ckpt.load(root)
    assert got["step"] == SAVES
    for name, t in state["model"].items():
        assert torch.equal(got["model"][name], t), name
