#!/usr/bin/env python3
"""real_state bench: ckpt inside a real training loop.

Builds a GPT (vocab 50257 x 768 token embedding, 6 blocks of d=768, untied
head) with AdamW in-process: ~1.4 GB of state (--quick: vocab 16384 x 384, 4
blocks, ~240 MB). Runs real training steps (forward, backward, AdamW step) on
random token batches and measures, in one process:

  blocked_over_copy_in_loop   blocked time of an eager save taken right after
                              optimizer.step() / copy_ of the same tensors into
                              pre-allocated tensors, timed at the same place
                              (medians); *_isolated_s: the same two with the
                              loop idle for a second before
  first_save_blocked_s        the first save's blocked time (it allocates and
                              first-touches the staging pool); with
                              Checkpointer.reserve (if it exists):
                              first_save_blocked_after_reserve_s
  persist_over_fio            durable time of a save (save_async to commit) /
                              an fio write of the same bytes (O_DIRECT,
                              io_uring, end_fsync) in the same directory just before
  dense_steps                 AdamW steps taken before the deltas are measured
                              (>= 20: every weight and both moments changed)
  exact_delta_over_full,      bytes on disk of an exact and a top-k (1 %) delta
  topk_delta_over_full        (delta_base default: differential) after real
                              AdamW steps / the full save's (medians)
  float_compressed_over_raw_fp32, _bf16
                              file bytes of a full save with compression=
                              "floats" (every block compressed) / tensor bytes;
                              bf16: the same state cast to bf16
  compressed_durable_over_raw_durable
                              durable time of full saves with
                              compression="floats" (adaptive rule on) / raw
                              saves, interleaved (medians), with
                              planes_encode_gbps_per_core, planes_load_gbps
                              and fio_write_gbps / fio_read_gbps beside them
  newest_of_11_restore_over_full, chain_restore_mbps_over_full
                              11 saves with delta="exact", full_every=11
                              (other options default), a real step between:
                              restore of the newest / of a full checkpoint of
                              the same state, and stored MB/s of the chain
                              restore / of the full one
  restore_into_speedup_over_torch_load
                              torch.load of a torch.save of the state (file
                              evicted from the page cache first) /
                              ckpt.load(..., into=the live state)
  step_slowdown_during_persist, step_slowdown_during_delta_persist
                              time of training steps that start while a full
                              save / an exact delta persists in the background
                              / step time with nothing in flight (medians; a
                              persist shorter than a step overlaps it only in part)
  engine_cpu_s_per_gb         CPU seconds of the process's threads other than
                              the caller's (os.times minus time.thread_time)
                              per GB saved, over full saves; *_delta: exact deltas

Prints one JSON line {"bench": "real_state", ...} with every raw time and the
torch version (Debian's torch 1.13 has a slow BLAS: steps are kept small, batch
1 x 16 tokens). Progress goes to stderr.

    python3 bench/real_state_bench.py [--quick] [--dir DIR] [--reps N] [--keep]
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

from bench_sizes import gpt_sizes

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))  # the models


def log(msg):
    print(f"[real_state] {msg}", file=sys.stderr, flush=True)


def med(xs):
    return statistics.median(xs) if xs else None


def other_threads_cpu():
    """(CPU s of the whole process, CPU s of the calling thread)."""
    t = os.times()
    return t.user + t.system, time.thread_time()


def fio_write_s(fio, directory, nbytes):
    """Seconds fio takes to write `nbytes` with O_DIRECT + io_uring + end_fsync
    (bs 1 MiB, depth 32: the library's defaults); None without fio."""
    if not shutil.which(fio):
        return None
    path = os.path.join(directory, "fio.dat")
    cmd = [fio, "--name=ckpt", f"--filename={path}", f"--size={nbytes}", "--bs=1048576",
           "--iodepth=32", "--ioengine=io_uring", "--direct=1", "--rw=write", "--end_fsync=1",
           "--output-format=json"]
    try:
        start = time.perf_counter()
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        wall = time.perf_counter() - start
        job = json.loads(out[out.find("{"):])["jobs"][0]["write"]
        return {"runtime_s": job["runtime"] / 1000, "wall_s": wall}
    except (subprocess.CalledProcessError, ValueError, KeyError) as e:
        log(f"fio failed: {e}")
        return None
    finally:
        if os.path.exists(path):
            os.remove(path)


class Loop:
    """The model, its optimizer, a batch source and the state to checkpoint."""

    def __init__(self, torch, workloads, quick):
        sizes = gpt_sizes(quick)
        self.torch = torch
        self.w = workloads.GptWorkload(0, seq=16, batch=1, **sizes)
        self.steps = 0  # AdamW steps taken

    def step(self):
        """One training step; returns its seconds."""
        self.steps += 1
        start = time.perf_counter()
        self.w.forward_backward()
        self.w.step()
        return time.perf_counter() - start

    def state(self):
        return self.w.state()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="~240 MB of state instead of ~1.4 GB")
    ap.add_argument("--dir", help="where to write (default: a temp dir under $TMPDIR), removed at the end")
    ap.add_argument("--reps", type=int, default=None, help="repetitions per measurement (default 5, quick 3)")
    ap.add_argument("--fio", default="fio")
    ap.add_argument("--keep", action="store_true", help="keep the files written")
    args = ap.parse_args()
    reps = args.reps or (3 if args.quick else 5)

    import torch
    import ckpt
    import realistic_workloads as workloads

    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    base = tempfile.mkdtemp(prefix="real-state.", dir=args.dir or os.environ.get("TMPDIR"))
    t0 = time.perf_counter()
    loop = Loop(torch, workloads, args.quick)
    for _ in range(2):
        loop.step()  # AdamW state exists
    state = loop.state()
    tensors = list(workloads.tensors_of(state))
    nbytes = workloads.state_bytes(state)
    gb = nbytes / 1e9
    log(f"state: {len(tensors)} tensors, {gb:.3f} GB; built in {time.perf_counter() - t0:.1f} s; torch "
        f"{torch.__version__}, {torch.get_num_threads()} threads; {ckpt.library_path()}")
    r = {"bench": "real_state", "quick": args.quick, "bytes": nbytes, "tensors": len(tensors),
         "reps": reps, "torch_version": torch.__version__, "torch_threads": torch.get_num_threads()}
    hung = None
    try:
        measure(r, torch, ckpt, loop, state, tensors, gb, base, reps, args.fio)
    except Hung as e:
        hung = e
    finally:
        if args.keep:
            log(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(r), flush=True)
    if hung is not None:
        log(f"error: {hung}; exiting without closing the engine")
        os._exit(2)
    return 0


class Hung(Exception):
    """A save did not commit in time; the engine cannot be closed."""


def measure(r, torch, ckpt, loop, state, tensors, gb, base, reps, fio):
    root = lambda name: os.path.join(base, name)  # noqa: E731
    # Baseline step time, nothing in flight.
    steps = [loop.step() for _ in range(reps)]
    r["step_s"], r["step_all_s"] = med(steps), steps
    log(f"step: {1e3 * r['step_s']:.0f} ms")

    # First save: pays for the staging pool; then with reserve() first, if it exists.
    with ckpt.Checkpointer(root("first")) as cp:
        loop.step()
        start = time.perf_counter()
        resp = cp.save_async(1, state)
        r["first_save_blocked_s"] = time.perf_counter() - start
        resp.result()
    shutil.rmtree(root("first"), ignore_errors=True)
    r["reserve_api"] = hasattr(ckpt.Checkpointer, "reserve")
    r["first_save_blocked_after_reserve_s"] = None
    if r["reserve_api"]:
        try:
            with ckpt.Checkpointer(root("reserve")) as cp:
                start = time.perf_counter()
                cp.reserve(state)  # returns at once; the pool is prepared in the background
                r["reserve_call_s"] = time.perf_counter() - start
                loop.step()  # what a loop does meanwhile
                loop.step()
                start = time.perf_counter()
                resp = cp.save_async(1, state)
                r["first_save_blocked_after_reserve_s"] = time.perf_counter() - start
                resp.result()
        except (AttributeError, RuntimeError) as e:  # a package newer than its extension
            r["reserve_error"] = str(e).splitlines()[0]
        shutil.rmtree(root("reserve"), ignore_errors=True)
    log(f"first save blocked {r['first_save_blocked_s']:.3f} s; after reserve: "
        f"{r['first_save_blocked_after_reserve_s']}")

    dst = [torch.empty_like(t) for t in tensors]
    for d in dst:
        d.fill_(0)

    def copy_s():
        start = time.perf_counter()
        for d, s in zip(dst, tensors):
            d.copy_(s)
        return time.perf_counter() - start

    with ckpt.Checkpointer(root("full"), full_every=1) as cp:
        cp.save(0, state)  # sizes the pool
        # In the loop: right after optimizer.step(), the previous save committed.
        blocked, copies, persist, durable, fio_s, cpu_other, saved = [], [], [], [], [], 0.0, 0
        step = 1
        for i in range(reps):
            loop.step()
            copies.append(copy_s())
            loop.step()
            start = time.perf_counter()
            resp = cp.save_async(step, state)
            blocked.append(time.perf_counter() - start)
            resp.result()
            step += 1
        # Isolated: the loop idle for a second.
        iso_blocked, iso_copies = [], []
        for i in range(reps):
            time.sleep(1)
            iso_copies.append(copy_s())
            time.sleep(1)
            start = time.perf_counter()
            resp = cp.save_async(step, state)
            iso_blocked.append(time.perf_counter() - start)
            resp.result()
            step += 1
        # Durable time vs fio just before; CPU of the engine's threads.
        for i in range(reps):
            f = fio_write_s(fio, root("full"), r["bytes"])
            if f:
                fio_s.append(f["runtime_s"])
            p0, m0 = other_threads_cpu()
            start = time.perf_counter()
            stats = cp.save_async(step, state).result()
            durable.append(time.perf_counter() - start)
            p1, m1 = other_threads_cpu()
            cpu_other += (p1 - p0) - (m1 - m0)
            saved += r["bytes"]
            persist.append(stats["persist_s"])
            step += 1
        # Training steps that start while a full save persists.
        during = []
        for i in range(reps):
            loop.step()
            resp = cp.save_async(step, state)
            while not resp.done():
                during.append(loop.step())
            resp.result()
            step += 1
        full_file_bytes = stats["file_bytes"]
    r.update({
        "copy_in_loop_s": med(copies), "blocked_in_loop_s": med(blocked),
        "blocked_over_copy_in_loop": med(blocked) / med(copies),
        "copy_in_loop_all_s": copies, "blocked_in_loop_all_s": blocked,
        "copy_isolated_s": med(iso_copies), "blocked_isolated_s": med(iso_blocked),
        "blocked_over_copy_isolated": med(iso_blocked) / med(iso_copies),
        "copy_isolated_all_s": iso_copies, "blocked_isolated_all_s": iso_blocked,
        "durable_s": med(durable), "durable_all_s": durable, "persist_s": med(persist),
        "fio_write_s": med(fio_s), "fio_write_all_s": fio_s,
        "persist_over_fio": med(durable) / med(fio_s) if fio_s else None,
        "engine_cpu_s_per_gb": cpu_other / (saved / 1e9),
        "step_during_persist_s": med(during), "step_during_persist_all_s": during,
        "step_slowdown_during_persist": med(during) / r["step_s"] if during else None,
        "full_file_bytes": full_file_bytes,
    })
    log(f"in loop: blocked {1e3 * med(blocked):.0f} ms vs copy_ {1e3 * med(copies):.0f} ms; isolated: "
        f"{1e3 * med(iso_blocked):.0f} vs {1e3 * med(iso_copies):.0f} ms; durable {med(durable):.2f} s "
        f"vs fio {r['fio_write_s']}; steps during persist {during}")
    dst.clear()  # frees the copies

    # Restore in place vs torch.load (both cold: ckpt reads with O_DIRECT, the
    # torch.save file is evicted from the page cache).
    path = root("state.pt")
    start = time.perf_counter()
    torch.save(state, path)
    r["torch_save_s"] = time.perf_counter() - start
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    start = time.perf_counter()
    loaded = torch.load(path)
    r["torch_load_s"] = time.perf_counter() - start
    del loaded
    os.remove(path)
    start = time.perf_counter()
    ckpt.load(root("full"), step=step - 1, into=state)
    r["ckpt_load_into_s"] = time.perf_counter() - start
    r["restore_into_speedup_over_torch_load"] = r["torch_load_s"] / r["ckpt_load_into_s"]
    log(f"torch.load {r['torch_load_s']:.2f} s, ckpt.load(into=) {r['ckpt_load_into_s']:.2f} s")
    shutil.rmtree(root("full"), ignore_errors=True)

    # Deltas after one real AdamW step; steps while an exact delta persists. A
    # delta that does not commit in time stops the bench (the engine cannot be
    # closed then): Hung carries the figures measured so far.
    deadline = max(60.0, 20 * r["durable_s"])
    while loop.steps < 20:  # dense moments: every weight and both moments changed
        loop.step()
    r["dense_steps"] = loop.steps
    for mode in ("exact", "topk"):
        cp = ckpt.Checkpointer(root(mode), delta=mode, topk_ratio=0.01, full_every=1000)
        full = cp.save(0, state)
        sizes, during, cpu_other, saved, delta_s = [], [], 0.0, 0, []
        for i in range(1, reps + 1):
            loop.step()
            p0, m0 = other_threads_cpu()
            start = time.perf_counter()
            resp = cp.save_async(i, state)
            while not resp.done():
                if time.perf_counter() - start > deadline:
                    r[f"{mode}_delta_error"] = f"delta save {i} not committed within {deadline:.0f} s"
                    raise Hung(r[f"{mode}_delta_error"])  # cp cannot be closed
                if mode == "exact":
                    during.append(loop.step())  # a step that starts while the delta persists
                else:
                    time.sleep(0.01)
            stats = resp.result()
            delta_s.append(time.perf_counter() - start)
            p1, m1 = other_threads_cpu()
            cpu_other += (p1 - p0) - (m1 - m0)
            saved += r["bytes"]
            sizes.append(stats["file_bytes"] / full["file_bytes"] if stats["kind"] == "delta" else 1.0)
        cp.close()
        shutil.rmtree(root(mode), ignore_errors=True)
        r[f"{mode}_delta_over_full"] = med(sizes)
        r[f"{mode}_delta_over_full_all"] = sizes
        r[f"{mode}_delta_durable_all_s"] = delta_s
        if mode == "exact":
            r["step_during_delta_persist_s"] = med(during)
            r["step_during_delta_persist_all_s"] = during
            r["step_slowdown_during_delta_persist"] = med(during) / r["step_s"] if during else None
            r["engine_cpu_s_per_gb_exact_delta"] = cpu_other / (saved / 1e9)
        log(f"{mode} delta / full: {sizes}")
    measure_compression(r, torch, ckpt, loop, state, root, reps, fio)
    measure_chain_restore(r, ckpt, loop, state, root)


def fio_read_s(fio, directory, nbytes):
    """Seconds fio takes to read `nbytes` (O_DIRECT, io_uring, bs 1 MiB, depth 32); None without fio."""
    if not shutil.which(fio):
        return None
    path = os.path.join(directory, "fio-read.dat")
    common = [f"--filename={path}", f"--size={nbytes}", "--bs=1048576", "--iodepth=32",
              "--ioengine=io_uring", "--direct=1", "--output-format=json"]
    try:
        subprocess.run([fio, "--name=fill", "--rw=write", "--end_fsync=1"] + common, check=True,
                       capture_output=True)
        out = subprocess.run([fio, "--name=ckpt", "--rw=read"] + common, check=True,
                             capture_output=True, text=True).stdout
        return json.loads(out[out.find("{"):])["jobs"][0]["read"]["runtime"] / 1000
    except (subprocess.CalledProcessError, ValueError, KeyError) as e:
        log(f"fio read failed: {e}")
        return None
    finally:
        if os.path.exists(path):
            os.remove(path)


def bf16_copy(torch, state):
    """`state` with every floating tensor as bf16 (a bf16-trained model's state)."""
    if isinstance(state, dict):
        return {k: bf16_copy(torch, v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(bf16_copy(torch, v) for v in state)
    if isinstance(state, torch.Tensor) and state.is_floating_point():
        return state.to(torch.bfloat16)
    return state


def measure_compression(r, torch, ckpt, loop, state, root, reps, fio):
    """Full saves with byte-plane ("floats") compression: size against raw for
    fp32 and bf16 (every block compressed: adaptive_compression=False), and
    durable time with the adaptive rule against raw saves, interleaved."""
    sizes = {}
    for name, st in (("fp32", state), ("bf16", bf16_copy(torch, state))):
        with ckpt.Checkpointer(root(f"planes-{name}"), compression="floats",
                               adaptive_compression=False) as cp:
            raw_bytes = sum(t.numel() * t.element_size() for t in _tensors(torch, st))
            start = time.perf_counter()
            stats = cp.save(0, st)
            sizes[name] = stats["file_bytes"] / raw_bytes
            if name == "fp32":
                r["planes_always_durable_s"] = time.perf_counter() - start
                r["planes_always_persist_s"] = stats["persist_s"]
        if name == "fp32":
            start = time.perf_counter()
            ckpt.load(root("planes-fp32"), into=state)
            r["planes_load_into_s"] = time.perf_counter() - start
        shutil.rmtree(root(f"planes-{name}"), ignore_errors=True)
    r["float_compressed_over_raw_fp32"] = sizes["fp32"]
    r["float_compressed_over_raw_bf16"] = sizes["bf16"]
    threads = min(8, len(os.sched_getaffinity(0)))
    r["encode_threads"] = threads
    r["planes_encode_gbps_per_core"] = r["bytes"] / 1e9 / r["planes_always_persist_s"] / threads
    r["planes_load_gbps"] = r["bytes"] / 1e9 / r["planes_load_into_s"]
    log(f"floats: fp32 {sizes['fp32']:.3f}, bf16 {sizes['bf16']:.3f} of raw; always-compressed durable "
        f"{r['planes_always_durable_s']:.2f} s")
    raw, comp = [], []
    with ckpt.Checkpointer(root("raw-durable"), full_every=1) as raw_cp, \
            ckpt.Checkpointer(root("planes-durable"), compression="floats") as comp_cp:
        raw_cp.save(0, state)
        comp_cp.save(0, state)  # sizes the pools, measures the disk and the codec
        for i in range(1, reps + 1):
            loop.step()
            for cp, times in ((raw_cp, raw), (comp_cp, comp)):
                start = time.perf_counter()
                stats = cp.save(i, state)
                times.append(time.perf_counter() - start)
            r["adaptive_compressed_over_raw_fp32"] = stats["file_bytes"] / r["bytes"]
    for name in ("raw-durable", "planes-durable"):
        shutil.rmtree(root(name), ignore_errors=True)
    r["raw_durable_all_s"], r["compressed_durable_all_s"] = raw, comp
    r["compressed_durable_over_raw_durable"] = med(comp) / med(raw)
    fw = fio_write_s(fio, root(""), r["bytes"])
    fr = fio_read_s(fio, root(""), r["bytes"])
    r["fio_write_gbps"] = r["bytes"] / 1e9 / fw["runtime_s"] if fw else None
    r["fio_read_gbps"] = r["bytes"] / 1e9 / fr if fr else None
    log(f"durable: floats (adaptive) {med(comp):.2f} s vs raw {med(raw):.2f} s; fio write "
        f"{r['fio_write_gbps']} GB/s, read {r['fio_read_gbps']} GB/s")


def _tensors(torch, state):
    if isinstance(state, dict):
        for v in state.values():
            yield from _tensors(torch, v)
    elif isinstance(state, (list, tuple)):
        for v in state:
            yield from _tensors(torch, v)
    elif isinstance(state, torch.Tensor):
        yield state


def measure_chain_restore(r, ckpt, loop, state, root):
    """11 saves with delta="exact", full_every=11 (other options default), a
    real AdamW step between saves: the restore of the newest against the
    restore of a full checkpoint of the same state (both cold: O_DIRECT)."""
    stats = []
    with ckpt.Checkpointer(root("chain"), delta="exact", full_every=11) as cp:
        for i in range(11):
            loop.step()
            stats.append(cp.save(i, state))
    with ckpt.Checkpointer(root("chain-full")) as cp:
        full = cp.save(10, state)
    start = time.perf_counter()
    ckpt.load(root("chain-full"), into=state)
    full_s = time.perf_counter() - start
    start = time.perf_counter()
    ckpt.load(root("chain"), into=state)
    newest_s = time.perf_counter() - start
    # What the newest's restore reads: its full save and the deltas it applies
    # (differential: the newest alone; chained: every one since the full).
    last_full = max(i for i, s in enumerate(stats) if s["kind"] == "full")
    kinds = "".join("F" if s["kind"] == "full" else "D" for s in stats)
    chained = False  # the default delta_base is "differential"
    read = stats[last_full]["file_bytes"] + (
        sum(s["file_bytes"] for s in stats[last_full + 1:]) if chained else
        (stats[-1]["file_bytes"] if last_full != 10 else 0))
    r["chain_kinds"] = kinds
    r["newest_of_11_restore_s"] = newest_s
    r["full_restore_s"] = full_s
    r["newest_of_11_restore_over_full"] = newest_s / full_s
    r["newest_of_11_read_over_full"] = read / full["file_bytes"]
    r["chain_restore_mbps_over_full"] = (read / newest_s) / (full["file_bytes"] / full_s)
    r["chain_delta_over_full_all"] = [s["file_bytes"] / full["file_bytes"] for s in stats]
    log(f"newest of 11 ({kinds}): {newest_s:.2f} s vs full {full_s:.2f} s; reads "
        f"{r['newest_of_11_read_over_full']:.2f}x the full at {r['chain_restore_mbps_over_full']:.2f}x its MB/s")
    for name in ("chain", "chain-full"):
        shutil.rmtree(root(name), ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
