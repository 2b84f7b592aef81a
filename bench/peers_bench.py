#!/usr/bin/env python3
"""peers bench: ckpt against torch.save and torch.distributed.checkpoint (DCP).

One run, one GPT-style state (model + AdamW after real training steps: vocab
50257 x 768 embedding, 6 blocks of d=768, untied head, ~1.4 GB; --quick: ~240
MB), one directory. Every saver runs in its own worker process (so its peak RSS
is its own) inside the same training loop:

    forward + backward
    [wait for the previous save's staging_completion]   <- part of the stall
    optimizer.step()
    save call                                           <- part of the stall
    ... training steps until that save is durable ...

  torch_save            torch.save to one file + fsync (file and directory)
  dcp_save              dcp.save, FileSystemWriter (1 writer thread: default)
  dcp_save_threads      dcp.save, FileSystemWriter(thread_count=--dcp-threads)
  dcp_async             dcp.async_save with its default stager (synchronous
                        staging; a new stager, so new staging memory, per save)
  dcp_async_sync_stager dcp.async_save with one DefaultStager(StagingOptions(
                        use_async_staging=False, ...)) reused across saves
                        (its staged copies are cached: the fastest synchronous
                        staging that works without a GPU)
  dcp_async_async_stager  the same with use_async_staging=True
  dcp_async_process     DCP's strongest configuration this torch has without
                        a GPU: async_save with the PROCESS checkpointer type
                        (the write runs in DCP's own background process; a
                        1-rank gloo group is created for it), one reused
                        DefaultStager with shared-memory asynchronous staging,
                        FileSystemWriter(thread_count=--dcp-threads,
                        sync_files=True: every file fsynced, as ckpt does)
  ckpt                  ckpt eager (Checkpointer(full_every=1))
  ckpt_lazy             ckpt lazy (lazy=True: copied while the loop runs
                        forward/backward; waited on before optimizer.step)

Pinned staging memory and DCP's non-blocking copies need a GPU: every DCP
stager here uses use_pinned_memory=False and use_non_blocking_copy=False, and
all but dcp_async_process use_shared_memory=False (the JSON line says so).

Per saver: the loop's stall per save (median of the steady saves; the first
save is reported apart: it allocates staging memory), time from the save call
until durable, bytes on disk, extra peak RSS (VmHWM during the saving loop over
VmHWM during the same loop without saves). Restores are measured by
bench/restore_bench.py (each loader in a fresh process, several rounds in
alternating order, checkpoints written back to back, against fio and a
buffered read of the same files): timing them here, after savers that wrote
minutes apart, in one process and one fixed order, flattered whichever ran
last.

Prints one JSON line {"bench": "peers", ...} with the ratios the issue asks for
(ckpt_blocked_over_dcp_async: eager vs DCP's best synchronous-staging stall;
ckpt_lazy_blocked_over_dcp_async: lazy vs DCP's best asynchronous staging (async
stager or process checkpointer); durable_over_dcp_save: ckpt vs DCP's best
dcp.save; rss_over_dcp_async) and every raw figure. Progress goes to stderr.

    python3 bench/peers_bench.py [--quick] [--dir DIR] [--saves N] [--keep]

(About 500 lines, over the house ~400: three savers, their worker processes
and the one JSON line share the state builder and the timing harness.)
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from bench_sizes import gpt_sizes

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))  # the models

SAVERS = ["torch_save", "dcp_save", "dcp_save_threads", "dcp_async", "dcp_async_sync_stager",
          "dcp_async_async_stager", "dcp_async_process", "ckpt", "ckpt_lazy"]
DCP_STAGING = dict(use_pinned_memory=False, use_shared_memory=False, use_non_blocking_copy=False)


def log(msg):
    print(f"[peers] {msg}", file=sys.stderr, flush=True)


def med(xs):
    return statistics.median(xs) if xs else None


def proc_status(field):
    """A VmRSS/VmHWM-style field of /proc/self/status, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak_rss():
    """Resets VmHWM to the current RSS (Linux: clear_refs 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def disk_bytes(path):
    """Bytes allocated on disk under `path` (st_blocks, like du)."""
    if os.path.isfile(path):
        return os.stat(path).st_blocks * 512
    total = 0
    for d, _, files in os.walk(path):
        for name in files:
            total += os.lstat(os.path.join(d, name)).st_blocks * 512
    return total


def fsync_path(path, directory=False):
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def drop_page_cache(paths):
    """Makes the next read of `paths` cold: drop_caches as root, else fadvise."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1")
        return "drop_caches"
    except OSError:
        for top in paths:
            for d, _, files in os.walk(top) if os.path.isdir(top) else [(os.path.dirname(top), [], [os.path.basename(top)])]:
                for name in files:
                    fd = os.open(os.path.join(d, name), os.O_RDONLY)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    os.close(fd)
        return "fadvise"


def make_workload(quick, seed=0):
    import realistic_workloads as workloads
    sizes = gpt_sizes(quick)
    return workloads, workloads.GptWorkload(seed, seq=64, batch=4, **sizes)


# -- savers ------------------------------------------------------------------
#
# Each has save(step, state) -> handle (after the call returns, the loop may
# run forward/backward), wait_staged(handle) (what the loop waits for before
# optimizer.step()), durable(handle) (blocks until durable), path_of(step) and
# close().

class TorchSave:
    def __init__(self, base, args):
        self.base = base
        os.makedirs(base, exist_ok=True)

    def path_of(self, step):
        return os.path.join(self.base, f"step_{step}.pt")

    def save(self, step, state):
        import torch
        path = self.path_of(step)
        torch.save(state, path)
        fsync_path(path)
        fsync_path(self.base, directory=True)
        return None

    def wait_staged(self, handle):
        pass

    def durable(self, handle):
        pass

    def close(self):
        pass


class DcpSave(TorchSave):
    def __init__(self, base, args, threads=1):
        super().__init__(base, args)
        self.threads = threads

    def path_of(self, step):
        return os.path.join(self.base, f"step_{step}")

    def save(self, step, state):
        import torch.distributed.checkpoint as dcp
        dcp.save(state, storage_writer=dcp.FileSystemWriter(self.path_of(step), thread_count=self.threads))
        return None


class DcpAsync(DcpSave):
    """async_save; stager None (its default, made per save) or one reused."""

    def __init__(self, base, args, stager_async=None):
        super().__init__(base, args)
        self.stager = None
        if stager_async is not None:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
            self.stager = DefaultStager(StagingOptions(use_async_staging=stager_async, **DCP_STAGING))

    def save(self, step, state):
        import torch.distributed.checkpoint as dcp
        kwargs = {"async_stager": self.stager} if self.stager is not None else {}
        return dcp.async_save(state, checkpoint_id=self.path_of(step), **kwargs)

    def wait_staged(self, handle):
        if hasattr(handle, "staging_completion"):  # AsyncSaveResponse: staging runs in the background
            handle.staging_completion.result()

    def durable(self, handle):
        (handle.upload_completion if hasattr(handle, "upload_completion") else handle).result()

    def close(self):
        if self.stager is not None:
            self.stager.close()


class DcpAsyncProcess(DcpAsync):
    """async_save, PROCESS checkpointer, shared-memory async staging (see the top)."""

    def __init__(self, base, args):
        import socket
        import torch.distributed as dist
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        TorchSave.__init__(self, base, args)
        self.threads = args.dcp_threads
        if not dist.is_initialized():  # the PROCESS checkpointer wants a default group
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        self.stager = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=True,
                                                   use_async_staging=True, use_non_blocking_copy=False))

    def save(self, step, state):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
        writer = dcp.FileSystemWriter(self.path_of(step), thread_count=self.threads, sync_files=True)
        return dcp.async_save(state, storage_writer=writer, async_stager=self.stager,
                              async_checkpointer_type=AsyncCheckpointerType.PROCESS)


class Ckpt:
    def __init__(self, base, args, lazy=False):
        import ckpt
        self.base = base
        self.cp = ckpt.Checkpointer(base, full_every=1, lazy=lazy, **json.loads(args.ckpt_options))
        self.engine_stats = []

    def path_of(self, step):
        return self.base

    def save(self, step, state):
        return self.cp.save_async(step, state)

    def wait_staged(self, handle):
        handle.staging_completion.result()

    def durable(self, handle):
        stats = handle.result()
        if isinstance(stats, dict):  # the engine's own account of the save
            self.engine_stats.append({k: stats.get(k) for k in ("blocked_s", "staging_s", "persist_s",
                                                                 "seconds", "persist_gbps")})

    def close(self):
        self.cp.close()


def make_saver(name, base, args):
    return {
        "torch_save": lambda: TorchSave(base, args),
        "dcp_save": lambda: DcpSave(base, args),
        "dcp_save_threads": lambda: DcpSave(base, args, threads=args.dcp_threads),
        "dcp_async": lambda: DcpAsync(base, args),
        "dcp_async_sync_stager": lambda: DcpAsync(base, args, stager_async=False),
        "dcp_async_async_stager": lambda: DcpAsync(base, args, stager_async=True),
        "dcp_async_process": lambda: DcpAsyncProcess(base, args),
        "ckpt": lambda: Ckpt(base, args),
        "ckpt_lazy": lambda: Ckpt(base, args, lazy=True),
    }[name]()


# -- the save worker ---------------------------------------------------------

def save_worker(args):
    import torch
    workloads, w = make_workload(args.quick)
    for _ in range(2):  # AdamW state exists
        w.forward_backward()
        w.step()
    state = w.state()
    out = {"saver": args.saver, "bytes": workloads.state_bytes(state),
           "tensors": len(list(workloads.tensors_of(state)))}

    # Steps without saves: their time, and the peak RSS a loop reaches anyway.
    reset_peak_rss()
    steps = []
    for _ in range(3):
        start = time.perf_counter()
        w.forward_backward()
        w.step()
        steps.append(time.perf_counter() - start)
    out["step_s"] = med(steps)
    hwm_no_save = proc_status("VmHWM")

    base = os.path.join(args.dir, args.saver)
    saver = make_saver(args.saver, base, args)
    reset_peak_rss()
    calls, waits, durables, steps_between, during = [], [], [], [], []
    pending = []  # the save whose staging the next optimizer.step() waits for

    def train_step():
        start = time.perf_counter()
        w.forward_backward()
        wait = 0.0
        if pending:
            t = time.perf_counter()
            saver.wait_staged(pending.pop())
            wait = time.perf_counter() - t
            waits.append(wait)
        w.step()
        return time.perf_counter() - start - wait

    for i in range(args.saves):
        train_step()
        state = w.state()
        start = time.perf_counter()
        handle = saver.save(i, state)
        calls.append(time.perf_counter() - start)
        pending.append(handle)
        done_at = []
        waiter = threading.Thread(target=lambda h=handle, t0=start: (saver.durable(h),
                                                                     done_at.append(time.perf_counter() - t0)),
                                  daemon=True)
        waiter.start()
        # Train on until the save is durable (DCP wants an async_save finished
        # before the next one); the first step takes the staging wait.
        n = 0
        while True:
            during.append(train_step())  # a step that starts while the save persists (less the staging wait)
            n += 1
            if not waiter.is_alive():
                break
            if n > 10000:
                raise RuntimeError(f"{args.saver}: save {i} not durable after 10000 steps")
        waiter.join()
        if not done_at:
            raise RuntimeError(f"{args.saver}: save {i} failed")
        durables.append(done_at[0])
        steps_between.append(n)
    out["peak_rss_extra_bytes"] = proc_status("VmHWM") - hwm_no_save
    if isinstance(saver, Ckpt):
        out["engine_stats"] = saver.engine_stats
        out["staging_bytes"] = saver.cp.stats()["staging_bytes"]
    saver.close()
    stalls = [c + wt for c, wt in zip(calls, waits)]
    ckpt_like = args.saver in ("ckpt", "ckpt_lazy")
    out.update({
        "first_stall_s": stalls[0], "stall_s": med(stalls[1:]), "stall_all_s": stalls,
        "call_all_s": calls, "staging_wait_all_s": waits,
        "first_durable_s": durables[0], "durable_s": med(durables[1:]), "durable_all_s": durables,
        "steps_while_persisting": steps_between, "step_during_persist_s": med(during),
        "step_slowdown_during_persist": ratio(med(during), out["step_s"]),
        "disk_bytes": ckpt_step_bytes(base) if ckpt_like else disk_bytes(saver.path_of(args.saves - 1)),
        "path": saver.path_of(args.saves - 1), "step": args.saves - 1,
    })
    print(json.dumps(out), flush=True)


def ckpt_step_bytes(root):
    """Bytes on disk of the newest step directory under a ckpt root."""
    steps = [d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and d.startswith("step")]
    if not steps:
        return disk_bytes(root)
    newest = max(steps)  # step-<zero-padded number>
    return disk_bytes(os.path.join(root, newest))


# -- the driver --------------------------------------------------------------

def run_worker(args, extra):
    cmd = [sys.executable, os.path.abspath(__file__), "--dir", args.dir_run, "--saves", str(args.saves),
           "--dcp-threads", str(args.dcp_threads), "--ckpt-options", args.ckpt_options] + \
        (["--quick"] if args.quick else []) + extra
    env = dict(os.environ)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env, timeout=args.worker_timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {' '.join(extra)} exited {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ratio(a, b):
    return a / b if a is not None and b else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="~240 MB of state instead of ~1.4 GB")
    ap.add_argument("--dir", help="where to write (default: a temp dir under $TMPDIR)")
    ap.add_argument("--saves", type=int, default=4, help="saves per saver; the first is cold (default 4)")
    ap.add_argument("--dcp-threads", type=int, default=4, help="writer threads of dcp_save_threads")
    ap.add_argument("--only", help="comma-separated savers (default: all)")
    ap.add_argument("--ckpt-options", default="{}",
                    help='further Checkpointer options of both ckpt savers, as JSON (e.g. \'{"background_nice": 0}\')')
    ap.add_argument("--keep", action="store_true", help="keep the files written")
    ap.add_argument("--worker-timeout", type=float, default=1800)
    ap.add_argument("--worker", choices=["save"], help=argparse.SUPPRESS)
    ap.add_argument("--saver", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.saves < 2:
        ap.error("--saves must be at least 2 (the first save is cold)")
    if args.worker == "save":
        return save_worker(args)

    import torch
    savers = args.only.split(",") if args.only else SAVERS
    for s in savers:
        if s not in SAVERS:
            ap.error(f"no saver named {s!r} (known: {', '.join(SAVERS)})")
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    args.dir_run = tempfile.mkdtemp(prefix="peers.", dir=args.dir or os.environ.get("TMPDIR"))
    r = {"bench": "peers", "quick": args.quick, "torch_version": torch.__version__,
         "torch_threads": torch.get_num_threads(), "saves": args.saves, "dcp_threads": args.dcp_threads,
         "dcp_staging_options": DCP_STAGING, "ckpt_options": json.loads(args.ckpt_options),
         "cuda": torch.cuda.is_available()}
    results = {}
    try:
        for s in savers:
            log(f"saver {s}")
            res = run_worker(args, ["--worker", "save", "--saver", s])
            results[s] = res
            r.setdefault("bytes", res["bytes"])
            r.setdefault("tensors", res["tensors"])
            log(f"  stall {res['stall_s']:.3f} s (first {res['first_stall_s']:.3f}), durable "
                f"{res['durable_s']:.2f} s, {res['disk_bytes'] / 1e9:.3f} GB on disk, extra peak RSS "
                f"{res['peak_rss_extra_bytes'] / 1e9:.3f} GB, step {res['step_s']:.3f} s")
            shutil.rmtree(os.path.join(args.dir_run, s), ignore_errors=True)
            os.sync()  # the removal settles before the next saver writes
    finally:
        if args.keep:
            log(f"kept {args.dir_run}")
        else:
            shutil.rmtree(args.dir_run, ignore_errors=True)

    for s, res in results.items():
        for k in ("stall_s", "first_stall_s", "durable_s", "first_durable_s", "disk_bytes",
                  "peak_rss_extra_bytes", "step_s", "step_slowdown_during_persist", "stall_all_s", "durable_all_s", "staging_wait_all_s",
                  "steps_while_persisting", "engine_stats", "staging_bytes"):
            if k in res:
                r[f"{s}_{k}"] = res[k]

    def best(names, key):
        vals = [(results[n][key], n) for n in names if n in results]
        return min(vals) if vals else (None, None)

    sync_stall, sync_name = best(["dcp_async", "dcp_async_sync_stager"], "stall_s")
    async_stall, async_name = best(["dcp_async_async_stager", "dcp_async_process"], "stall_s")
    dcp_durable, dcp_durable_name = best(["dcp_save", "dcp_save_threads"], "durable_s")
    get = lambda s, k: results[s][k] if s in results else None  # noqa: E731
    r.update({
        "dcp_sync_staging_reference": sync_name, "dcp_save_reference": dcp_durable_name,
        "dcp_async_staging_reference": async_name,
        "ckpt_blocked_over_dcp_async": ratio(get("ckpt", "stall_s"), sync_stall),
        # Each synchronous-staging configuration on its own (the ratio above
        # takes the faster one).
        "ckpt_blocked_over_dcp_async_default_stager": ratio(get("ckpt", "stall_s"),
                                                            get("dcp_async", "stall_s")),
        "ckpt_blocked_over_dcp_async_sync_stager": ratio(get("ckpt", "stall_s"),
                                                         get("dcp_async_sync_stager", "stall_s")),
        "ckpt_lazy_blocked_over_dcp_async": ratio(get("ckpt_lazy", "stall_s"), async_stall),
        "ckpt_blocked_over_torch_save": ratio(get("ckpt", "stall_s"), get("torch_save", "stall_s")),
        "durable_over_dcp_save": ratio(get("ckpt", "durable_s"), dcp_durable),
        "lazy_durable_over_dcp_save": ratio(get("ckpt_lazy", "durable_s"), dcp_durable),
        "rss_over_dcp_async": ratio(get("ckpt", "peak_rss_extra_bytes"),
                                    get(sync_name, "peak_rss_extra_bytes") if sync_name else None),
        "lazy_rss_over_dcp_async": ratio(get("ckpt_lazy", "peak_rss_extra_bytes"),
                                         get(async_name, "peak_rss_extra_bytes") if async_name else None),
        "disk_over_dcp_save": ratio(get("ckpt", "disk_bytes"), get("dcp_save", "disk_bytes")),
    })
    print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
