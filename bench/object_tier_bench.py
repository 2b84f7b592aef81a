#!/usr/bin/env python3
"""object_tier bench: ckpt's bucket tier against boto3's transfer manager, on moto.

One checkpoint of --mb MiB of float32 tensors (a few large, many small) is
saved locally with ckpt. Then, against moto's S3 server on loopback (the same
server, the same run):

  ckpt_upload     `ckpt-retain --keep-last 1 --cold-dir s3://...` moving that
                  step: every file uploaded (8 MiB parts, 8 streams) and
                  checked by the ETags moto returns (MD5s: nothing read
                  back), the lease taken and released, the commit marker
                  written and read back, the hot copy removed (the protocol
                  of docs/object-storage.md)
  boto3_upload    boto3's S3Transfer.upload_file of the same files (its
                  defaults: 8 MiB multipart threshold and parts, 10 threads);
                  no check, no marker
  ckpt_restore    ckpt.load("s3://...") of the step (every tensor checked)
  boto3_restore   boto3's download_fileobj of the same objects into memory

Each side uploads its own copy of the step (the two saved back to back, so
neither reads files the other just read); the order alternates round by
round; --reps rounds, medians. The client's CPU time of each upload (this
process and its children: ckpt-retain) is reported per GiB too: on this
machine the server shares the two cores, so the CPU a client spends is the
part of its cost that carries over to a remote bucket. Prints one JSON line:
  {"bench": "object_tier", "bytes": ..., "upload_over_boto3": t_boto3/t_ckpt,
   "restore_over_boto3": ..., "step_slowdown_during_upload": null, ...}
(>1: ckpt moves the bytes faster than boto3). moto is a Python server and is
the bottleneck for both; against a real bucket (CKPT_BENCH_S3_URL, not run
here) the ratios would differ. `step_slowdown_during_upload`: the median time of a CPU
training step (matmuls) while a Checkpointer with tier= uploads each save
behind it (2 streams, 8 MiB/s each at most; `..._at_2x64mib_s`: 64 MiB/s
each, more than moto takes here, so uncapped in effect), over the same
without a tier.
On this machine moto runs on the same cores, so the figure includes the
server's CPU, which a remote bucket would not cost.
"""
import argparse
import io
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

REPO = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))


def log(*args):
    print("object_tier_bench:", *args, file=sys.stderr, flush=True)


def step_slowdown(a, server, state, ckpt, torch, rates):
    """A CPU training step (matmuls) timed while saving every 5 steps: with a
    plain Checkpointer, then with tier= uploading each save behind it at each
    per-stream cap of `rates` (2 streams), runs alternating with the plain
    one. Returns the median step times and their ratios."""
    x = torch.randn(384, 384)

    def train(root, **tier):
        times = []
        with ckpt.Checkpointer(root, **tier) as cp:
            for step in range(1, 31):
                t = time.perf_counter()
                y = x
                for _ in range(8):
                    y = torch.tanh(y @ x)
                times.append(time.perf_counter() - t)
                if step % 5 == 0:
                    cp.save_async(step, state)
            if tier:
                cp.wait_tier(timeout=600)
        shutil.rmtree(root, ignore_errors=True)
        return statistics.median(times[5:])

    bucket = f"bench-{uuid.uuid4().hex[:10]}"
    server.stdin.write(f"bucket {bucket}\n")
    server.stdin.flush()
    assert server.stdout.readline().strip() == "ok"
    out = {}
    for rate in rates:
        base = train(os.path.join(a.dir, "train-plain"))
        tier = train(os.path.join(a.dir, "train-tier"), tier=f"s3://{bucket}/train-{rate}", tier_streams=2,
                     tier_max_upload_rate=rate)
        out[rate] = {"base": round(base, 5), "tier": round(tier, 5), "ratio": round(tier / base, 3)}
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--mb", type=int, default=256)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--build", default=os.path.join(REPO, "build"))
    p.add_argument("--keep", action="store_true")
    a = p.parse_args()

    import boto3
    import torch
    import ckpt
    from boto3.s3.transfer import TransferConfig

    retain = os.path.join(a.build, "tools", "ckpt-retain")
    os.makedirs(a.dir, exist_ok=True)
    server = subprocess.Popen([sys.executable, os.path.join(REPO, "tests", "object_store", "s3_server.py")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline().strip()
        if not line or line.startswith("error"):
            raise SystemExit(f"moto S3 server did not start: {line!r}")
        endpoint = f"http://{line}"
        env = dict(os.environ, AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="testing",
                   AWS_SECRET_ACCESS_KEY="testing", AWS_REGION="us-east-1")
        os.environ.update({k: env[k] for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID",
                                               "AWS_SECRET_ACCESS_KEY", "AWS_REGION")})
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        transfer = TransferConfig()  # the defaults `aws s3 cp` uses
        n_big = max(1, a.mb // 32)
        big = (a.mb << 20) * 3 // 4 // n_big // 4
        small = ((a.mb << 20) // 4) // 200 // 4
        state = {f"layer{i}.w": torch.randn(big) for i in range(n_big)}
        state.update({f"norm{i}.b": torch.randn(small) for i in range(200)})
        total = sum(t.numel() * 4 for t in state.values())
        times = {k: [] for k in ("ckpt_upload", "boto3_upload", "ckpt_restore", "boto3_restore")}
        cpu = {k: [] for k in ("ckpt_upload", "boto3_upload")}
        for rep in range(a.reps):
            bucket = f"bench-{uuid.uuid4().hex[:10]}"
            server.stdin.write(f"bucket {bucket}\n")
            server.stdin.flush()
            assert server.stdout.readline().strip() == "ok"
            # One save per side, back to back, so that neither reads files
            # the other just read (ckpt-retain also removes its local copy).
            roots, step_dirs = {}, {}
            for side in ("ckpt", "boto3"):
                roots[side] = os.path.join(a.dir, f"{side}{rep}")
                with ckpt.Checkpointer(roots[side]) as cp:
                    cp.save_async(1, state)
                    cp.save_async(2, {"x": torch.zeros(1)})
                step_dirs[side] = os.path.join(roots[side], sorted(
                    d for d in os.listdir(roots[side]) if d.startswith("step-"))[0])
            files = sorted(os.listdir(step_dirs["boto3"]))

            def ckpt_upload():
                out = subprocess.run([retain, "--root", roots["ckpt"], "--keep-last", "1", "--cold-dir",
                                      f"s3://{bucket}/ckpt"], env=env, capture_output=True, text=True)
                if out.returncode != 0:
                    raise SystemExit(f"ckpt-retain failed: {out.stderr}")

            def boto3_upload():
                for f in files:
                    s3.upload_file(os.path.join(step_dirs["boto3"], f), bucket, f"boto/{f}", Config=transfer)

            def ckpt_restore():
                loaded = ckpt.load(f"s3://{bucket}/ckpt", step=1)
                assert torch.equal(loaded["layer0.w"], state["layer0.w"])

            def boto3_restore():
                for f in files:
                    s3.download_fileobj(bucket, f"boto/{f}", io.BytesIO(), Config=transfer)

            # Alternating order, round by round.
            ups = [("ckpt_upload", ckpt_upload), ("boto3_upload", boto3_upload)]
            downs = [("ckpt_restore", ckpt_restore), ("boto3_restore", boto3_restore)]
            if rep % 2:
                ups.reverse()
                downs.reverse()
            for name, run in ups + downs:
                c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                p0 = time.process_time()
                t = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - t)
                c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                if name in cpu:  # this process's CPU and its children's (ckpt-retain)
                    cpu[name].append(time.process_time() - p0 + c1.ru_utime + c1.ru_stime -
                                     c0.ru_utime - c0.ru_stime)
            if not a.keep:
                for root in roots.values():
                    shutil.rmtree(root, ignore_errors=True)
        rates = [8 << 20, 64 << 20]  # per stream, 2 streams
        slowdown = step_slowdown(a, server, state, ckpt, torch, rates)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(json.dumps({
            "bench": "object_tier", "server": "moto (loopback)", "bytes": total, "reps": a.reps,
            "upload_over_boto3": round(med["boto3_upload"] / med["ckpt_upload"], 3),
            "restore_over_boto3": round(med["boto3_restore"] / med["ckpt_restore"], 3),
            "step_slowdown_during_upload": slowdown[rates[0]]["ratio"],
            "step_s_no_tier": slowdown[rates[0]]["base"], "step_s_with_tier": slowdown[rates[0]]["tier"],
            "tier_max_upload_rate": rates[0],
            "step_slowdown_during_upload_at_2x64mib_s": slowdown[rates[1]]["ratio"],
            "upload_client_cpu_over_boto3": round(statistics.median(cpu["ckpt_upload"]) /
                                                  statistics.median(cpu["boto3_upload"]), 3),
            "ckpt_upload_cpu_s_per_gib": round(statistics.median(cpu["ckpt_upload"]) * 2**30 / total, 3),
            "boto3_upload_cpu_s_per_gib": round(statistics.median(cpu["boto3_upload"]) * 2**30 / total, 3),
            "ckpt_upload_mb_s": round(total / 2**20 / med["ckpt_upload"], 1),
            "boto3_upload_mb_s": round(total / 2**20 / med["boto3_upload"], 1),
            "ckpt_restore_mb_s": round(total / 2**20 / med["ckpt_restore"], 1),
            "boto3_restore_mb_s": round(total / 2**20 / med["boto3_restore"], 1),
            "note": "ckpt upload includes its lease, ETag checks, the commit marker and removing the hot copy; boto3's does not",
        }), flush=True)
    finally:
        server.stdin.close()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    main()
