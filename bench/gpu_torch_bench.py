"""gpu_torch_bench: ckpt from a PyTorch training loop on a GPU, against the
floor (a device-to-host copy of the same tensors into pinned memory) and
against torch.distributed.checkpoint's async_save on the same device, in one
run.

State: a GPT-2-small-shaped model (vocab 50304, d 768, 12 blocks) with its
AdamW moments, on the GPU after real training steps (~1.5 GB). Measures:
  d2h_s            every tensor copy_(non_blocking) into pinned host tensors on
                   a side stream, then synchronize (median of --reps)
  first/steady     Checkpointer(staging_reserve_bytes=state) opened, training
                   for >= 3 s (the reservation pins meanwhile, on its thread),
                   then the first save_async (eager) and --reps more: time
                   save_async held the loop
  unreserved_first the first save of a Checkpointer without a hint (it grows
                   the pool unpinned)
  lazy_blocked_s   save_async with lazy=True (returns before copying)
  step_slowdown    mean training-step time (synchronized per step) while a
                   save persists behind the loop, over the idle step time
  restore          ckpt.load(root, into=<the CUDA state>) in a fresh process,
                   page cache dropped when allowed, over the read limit of the
                   same files: a direct (O_DIRECT) parallel read of them, in
                   alternating order, medians
  dcp              torch.distributed.checkpoint.async_save of the same state:
                   blocked (until it returns) and durable (future done), with
                   the default stager and, where the installed torch has it,
                   DefaultStager(StagingOptions(...)) with pinned, shared,
                   asynchronous staging.
Prints one JSON line {"bench": "gpu_torch", ...}. Without CUDA prints
{"bench": "gpu_torch", "skipped": ...}.

    python3 bench/gpu_torch_bench.py --dir /tmp/b [--reps 5] [--quick]
"""
import argparse
import json
import math
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

import torch
import torch.nn.functional as F


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from realistic_workloads import GPT  # noqa: E402  (the model the tests train)


def log(msg):
    print(f"[gpu_torch_bench] {msg}", file=sys.stderr, flush=True)


class Loop:
    def __init__(self, quick):
        torch.manual_seed(0)
        if quick:
            self.vocab, d, layers, heads, self.seq, self.batch = 8192, 256, 4, 4, 128, 8
        else:
            self.vocab, d, layers, heads, self.seq, self.batch = 50304, 768, 12, 12, 512, 8
        self.model = GPT(self.vocab, d, layers, heads, self.seq).cuda()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=True)
        self.tokens = torch.randint(self.vocab, (self.batch, self.seq + 1), device="cuda")

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = self.model(self.tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, self.vocab).float(), self.tokens[:, 1:].reshape(-1))
        loss.backward()
        self.opt.step()

    def timed_step(self):
        torch.cuda.synchronize()
        t = time.perf_counter()
        self.step()
        torch.cuda.synchronize()
        return time.perf_counter() - t

    def state(self):
        return {"model": self.model.state_dict(), "optim": self.opt.state_dict()}


def tensors_of(tree):
    out = []
    if isinstance(tree, torch.Tensor):
        out.append(tree)
    elif isinstance(tree, dict):
        for v in tree.values():
            out += tensors_of(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            out += tensors_of(v)
    return out


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def d2h_floor(tensors, reps):
    pinned = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
    side = torch.cuda.Stream()
    times = []
    for r in range(reps + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.cuda.stream(side):
            for src, dst in zip(tensors, pinned):
                dst.copy_(src, non_blocking=True)
        side.synchronize()
        if r:
            times.append(time.perf_counter() - t0)
    return med(times)


def train_for(loop, seconds):
    t0 = time.perf_counter()
    steps = 0
    while time.perf_counter() - t0 < seconds:
        loop.step()
        steps += 1
    torch.cuda.synchronize()
    return steps


def ckpt_saves(ckpt, loop, root, reps, nbytes, lazy=False, reserve=True):
    """First and steady save_async times; the checkpoints are kept (the last one
    is restored later)."""
    opts = {"staging_reserve_bytes": nbytes} if reserve else {}
    cp = ckpt.Checkpointer(root, lazy=lazy, **opts)
    if reserve:
        train_for(loop, 3.0)  # the loop computes while the pool is pinned behind it
    blocked, staged, memory = [], [], []
    for r in range(reps + 1):
        loop.step()
        t0 = time.perf_counter()
        resp = cp.save_async(r, loop.state())
        returned = time.perf_counter() - t0
        resp.staging_completion.result(timeout=300)
        held = time.perf_counter() - t0
        resp.result(timeout=600)
        blocked.append(returned)
        staged.append(held)
        memory.append(cp.stats()["last"].get("staging_memory", ""))
        if not (reserve or lazy):
            break
    cp.close()
    return blocked, staged, memory


def step_slowdown(ckpt, loop, root, nbytes):
    """Step time while saves persist behind the loop, over idle step time."""
    idle = [loop.timed_step() for _ in range(20)]
    busy = []
    with ckpt.Checkpointer(root, staging_reserve_bytes=nbytes) as cp:
        train_for(loop, 3.0)
        for s in range(3):
            resp = cp.save_async(1000 + s, loop.state())
            while not resp.done():
                busy.append(loop.timed_step())
            resp.result(timeout=600)
    return med(idle), med(busy), len(busy)


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError as e:
        return f"none ({e.strerror})"


def direct_read_s(files, threads=8, block=16 << 20):
    """Reads every file with O_DIRECT, `threads` at a time, into aligned buffers."""
    jobs = []
    for f in files:
        size = os.path.getsize(f)
        for off in range(0, size, block):
            jobs.append((f, off, min(block, size - off)))
    lock = threading.Lock()
    total = [0]

    def worker():
        buf = mmap.mmap(-1, block)
        fds = {}
        while True:
            with lock:
                if not jobs:
                    break
                f, off, n = jobs.pop()
            fd = fds.get(f)
            if fd is None:
                fd = fds[f] = os.open(f, os.O_RDONLY | os.O_DIRECT)
            view = memoryview(buf)[: (n + 4095) // 4096 * 4096]
            got = os.preadv(fd, [view], off)
            with lock:
                total[0] += min(got, n)
        for fd in fds.values():
            os.close(fd)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0, total[0]


def restore_child(args):
    """In a fresh process: builds the same model on the GPU, then times
    ckpt.load(into=) of the newest step of args.root."""
    import ckpt
    loop = Loop(args.quick)
    loop.step()
    torch.cuda.synchronize()
    state = loop.state()
    t0 = time.perf_counter()
    ckpt.load(args.root, into=state)
    torch.cuda.synchronize()
    print(json.dumps({"load_s": time.perf_counter() - t0}))


def dcp_saves(loop, root, reps):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    if not dist.is_initialized():  # one rank, as a single-GPU job runs it
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(root, 'pg')}", rank=0, world_size=1)
    out = {}
    variants = [("default", None)]
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        variants.append(("pinned_async", lambda: DefaultStager(StagingOptions(True, True, True, True))))
    except Exception as e:  # noqa: BLE001 - older torch
        out["dcp_pinned_async_error"] = f"{type(e).__name__}: {e}"
    for name, stager in variants:
        blocked, durable = [], []
        try:
            for r in range(reps + 1):
                loop.step()
                path = os.path.join(root, f"dcp-{name}-{r}")
                kwargs = {"async_stager": stager()} if stager else {}
                t0 = time.perf_counter()
                fut = dcp.async_save(loop.state(), checkpoint_id=path, **kwargs)
                b = time.perf_counter() - t0
                fut.result()
                d = time.perf_counter() - t0
                if r:
                    blocked.append(b)
                    durable.append(d)
                shutil.rmtree(path, ignore_errors=True)
            out[f"dcp_{name}_blocked_s"] = med(blocked)
            out[f"dcp_{name}_durable_s"] = med(durable)
        except Exception as e:  # noqa: BLE001 - recorded, not fatal
            out[f"dcp_{name}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            log(f"dcp {name}: {type(e).__name__}: {e}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=os.environ.get("TMPDIR", "/tmp"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--child-restore", dest="root")
    args = ap.parse_args()
    if args.root:
        return restore_child(args)
    if not torch.cuda.is_available():
        print(json.dumps({"bench": "gpu_torch", "skipped": "no CUDA device"}))
        return
    import ckpt
    base = os.path.join(args.dir, f"gpu_torch_bench-{os.getpid()}")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    loop = Loop(args.quick)
    for _ in range(3):
        loop.step()
    torch.cuda.synchronize()
    tensors = [t for t in tensors_of(loop.state()) if t.is_cuda]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    log(f"state: {len(tensors)} CUDA tensors, {nbytes / 1e9:.3f} GB on {torch.cuda.get_device_name()}")
    r = {"bench": "gpu_torch", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
         "bytes": nbytes, "tensors": len(tensors)}
    r["d2h_s"] = d2h_floor(tensors, args.reps)
    log(f"d2h floor {r['d2h_s']:.4f} s")

    _, staged, mem = ckpt_saves(ckpt, loop, os.path.join(base, "unreserved"), 0, nbytes, reserve=False)
    r["unreserved_first_blocked_s"], r["unreserved_first_memory"] = staged[0], mem[0]
    _, staged, mem = ckpt_saves(ckpt, loop, os.path.join(base, "eager"), args.reps, nbytes)
    r["first_blocked_s"] = staged[0]
    r["steady_blocked_s"] = med(staged[1:])
    r["steady_memory"] = mem[-1]
    returned, staged, _ = ckpt_saves(ckpt, loop, os.path.join(base, "lazy"), args.reps, nbytes, lazy=True)
    r["lazy_blocked_s"] = med(returned[1:])
    r["lazy_staged_s"] = med(staged[1:])
    log(f"ckpt: first {r['first_blocked_s']:.4f} s, steady {r['steady_blocked_s']:.4f} s, "
        f"lazy {r['lazy_blocked_s'] * 1e3:.3f} ms, unreserved first {r['unreserved_first_blocked_s']:.3f} s")
    idle, busy, n = step_slowdown(ckpt, loop, os.path.join(base, "slowdown"), nbytes)
    r.update(step_idle_s=idle, step_during_persist_s=busy, steps_during_persist=n)

    # Restore into CUDA tensors vs the read limit of the same files.
    root = os.path.join(base, "eager")
    newest = sorted(d for d in os.listdir(root) if d.startswith("step-"))[-1]
    files = [os.path.join(root, newest, f) for f in os.listdir(os.path.join(root, newest)) if f.endswith(".shard")]
    loads, limits, drops = [], [], set()
    env = dict(os.environ)
    for i in range(args.rounds):
        for which in (("ckpt", "limit") if i % 2 == 0 else ("limit", "ckpt")):
            drops.add(drop_caches())
            if which == "limit":
                s, got = direct_read_s(files)
                limits.append(s)
            else:
                out = subprocess.run([sys.executable, __file__, "--child-restore", root] + (["--quick"] if args.quick else []),
                                     env=env, capture_output=True, text=True, timeout=600)
                if out.returncode != 0:
                    raise SystemExit(f"restore child failed: {out.stderr[-2000:]}")
                loads.append(json.loads(out.stdout.strip().splitlines()[-1])["load_s"])
    file_bytes = sum(os.path.getsize(f) for f in files)
    r.update(restore_s=med(loads), restore_s_min=min(loads), restore_s_max=max(loads),
             read_limit_s=med(limits), restore_file_bytes=file_bytes, cache_drop=sorted(drops))
    r.update(dcp_saves(loop, base, max(2, args.reps // 2)))

    r["first_over_steady"] = r["first_blocked_s"] / r["steady_blocked_s"]
    r["steady_over_d2h"] = r["steady_blocked_s"] / r["d2h_s"]
    r["step_slowdown_during_persist"] = busy / idle if idle > 0 and busy == busy else float("nan")
    r["restore_over_read_limit"] = r["read_limit_s"] / r["restore_s"]  # >= 0.9: at the disk's speed
    if "dcp_default_blocked_s" in r:
        r["blocked_over_dcp"] = r["steady_blocked_s"] / r["dcp_default_blocked_s"]
    for k, v in list(r.items()):
        if isinstance(v, float):
            r[k] = round(v, 5) if math.isfinite(v) else None
    print(json.dumps(r), flush=True)
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
