#!/usr/bin/env python3
"""post_step_probe: why is an eager save slower right after optimizer.step()?

Builds the real_state bench's GPT + AdamW state (~1.4 GB; --quick ~240 MB) and
times an eager ckpt save and a copy_ of the same tensors into pre-allocated
tensors at several places of a training loop, each in isolation (the previous
save committed first):

  idle          after 1 s of nothing
  after_step    right after forward + backward + optimizer.step()
  after_optim   right after optimizer.step() alone (gradients kept from before)
  after_fwdbwd  right after forward + backward, no optimizer step
  step_sleep_N  after a full step and N ms of sleep
  persisting    right after a full step while another engine's save of the
                same state is still being written

For each it also records, over the timed window: CPU seconds per thread
(/proc/self/task, by thread name), minor/major page faults (getrusage), the
machine's steal and iowait time (/proc/stat) and Dirty/Writeback (/proc/meminfo).
Prints one JSON line per place, then a summary line; run it under different
environments (OMP_WAIT_POLICY=PASSIVE, GOMP_SPINCOUNT=0, --threads 1) to
compare.

    python3 bench/post_step_probe.py [--quick] [--reps N] [--dir DIR] [--threads N]
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
TICK = os.sysconf("SC_CLK_TCK")


def threads_cpu():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        out[f"{name}:{tid}"] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def machine():
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    mem = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":")
            if k in ("Dirty", "Writeback"):
                mem[k] = int(v.split()[0]) * 1024
    return {"iowait": cpu[4] / TICK, "steal": cpu[7] / TICK if len(cpu) > 7 else 0.0, **mem}


class Window:
    """What happened in the process and the machine during a timed call."""

    def __enter__(self):
        self.cpu, self.ru, self.m = threads_cpu(), resource.getrusage(resource.RUSAGE_SELF), machine()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start
        cpu, ru, m = threads_cpu(), resource.getrusage(resource.RUSAGE_SELF), machine()
        self.threads = {k: round(v - self.cpu.get(k, 0.0), 3) for k, v in cpu.items()
                        if v - self.cpu.get(k, 0.0) > 0}
        self.minflt, self.majflt = ru.ru_minflt - self.ru.ru_minflt, ru.ru_majflt - self.ru.ru_majflt
        self.steal, self.iowait = m["steal"] - self.m["steal"], m["iowait"] - self.m["iowait"]
        self.dirty_before, self.writeback_before = self.m.get("Dirty"), self.m.get("Writeback")
        return False

    def record(self):
        return {"s": round(self.seconds, 4), "threads_cpu_s": self.threads, "minflt": self.minflt,
                "majflt": self.majflt, "steal_s": round(self.steal, 3), "iowait_s": round(self.iowait, 3),
                "dirty_before": self.dirty_before, "writeback_before": self.writeback_before}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir")
    ap.add_argument("--threads", type=int, help="torch.set_num_threads(N) first")
    ap.add_argument("--places", default="idle,after_step,after_optim,after_fwdbwd,step_sleep_50,"
                                        "step_sleep_300,step_sleep_1000,persisting")
    args = ap.parse_args()

    import torch
    import ckpt
    import realistic_workloads as workloads

    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = dict(vocab=16384, d=384, layers=4, heads=6) if args.quick else \
        dict(vocab=50257, d=768, layers=6, heads=12)
    w = workloads.GptWorkload(0, seq=16, batch=1, **sizes)
    w.train(2)
    state = w.state()
    tensors = list(workloads.tensors_of(state))
    dst = [torch.empty_like(t).fill_(0) for t in tensors]
    env = {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    base = args.dir or tempfile.mkdtemp(prefix="ckpt-probe-", dir=os.environ.get("TMPDIR"))
    os.makedirs(base, exist_ok=True)
    head = {"probe": "post_step", "bytes": workloads.state_bytes(state), "torch_version": torch.__version__,
            "torch_threads": torch.get_num_threads(), "env": env,
            "tasks": sorted(set(k.split(":")[0] for k in threads_cpu()))}
    cp = ckpt.Checkpointer(os.path.join(base, "a"))
    other = ckpt.Checkpointer(os.path.join(base, "b"))
    cp.save(0, state)  # both pools allocated before anything is timed
    other.save(0, state)
    step = 1

    def prepare(place):
        nonlocal step
        if place == "idle":
            time.sleep(1)
        elif place == "after_step":
            w.forward_backward()
            w.step()
        elif place == "after_optim":
            w.forward_backward()
            time.sleep(0.5)
            w.optimizer.step()
        elif place == "after_fwdbwd":
            w.forward_backward()
        elif place.startswith("step_sleep_"):
            w.forward_backward()
            w.step()
            time.sleep(int(place.rsplit("_", 1)[1]) / 1000)
        elif place == "persisting":
            w.forward_backward()
            resp = other.save_async(step, state)  # its writes run during the step below
            step += 1
            w.step()
            return resp
        return None

    summary = {}
    for place in args.places.split(","):
        saves, copies = [], []
        for rep in range(args.reps):
            for what in (("save", "copy") if rep % 2 == 0 else ("copy", "save")):
                bg = prepare(place)
                with Window() as win:
                    if what == "save":
                        resp = cp.save_async(step, state)
                    else:
                        for d, s in zip(dst, tensors):
                            d.copy_(s)
                rec = win.record()
                if what == "save":
                    rec["in_flight_other_done"] = bg.done() if bg is not None else None
                    resp.result()
                    step += 1
                    saves.append(rec)
                else:
                    copies.append(rec)
                if bg is not None:
                    bg.result()
        line = {**head, "place": place, "save_s": statistics.median(r["s"] for r in saves),
                "copy_s": statistics.median(r["s"] for r in copies), "saves": saves, "copies": copies}
        summary[place] = {"save_ms": round(1e3 * line["save_s"]), "copy_ms": round(1e3 * line["copy_s"])}
        print(json.dumps(line), flush=True)
        print(f"[probe] {place}: save {summary[place]['save_ms']} ms, copy_ {summary[place]['copy_ms']} ms",
              file=sys.stderr, flush=True)
    cp.close()
    other.close()
    shutil.rmtree(base, ignore_errors=True)
    print(json.dumps({**head, "summary": summary}), flush=True)


if __name__ == "__main__":
    main()
