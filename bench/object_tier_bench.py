#!/usr/bin/env python3
"""object_tier bench: ckpt's bucket tier against boto3's transfer manager, on moto.

One checkpoint of --mb MiB of float32 tensors (a few large, many small) is
saved locally with ckpt. Then, against moto's S3 server on loopback (the same
server, the same run):

  ckpt_upload     `ckpt-retain --keep-last 1 --cold-dir s3://...` moving that
                  step: every file uploaded (16 MiB parts, 8 streams) and
                  checked by the ETags moto returns (MD5s: nothing read
                  back), the lease taken and released, the commit marker
                  written and read back, the hot copy removed (the protocol
                  of docs/object-storage.md)
  boto3_upload    boto3's S3Transfer.upload_file of the same files (its
                  defaults: 8 MiB multipart threshold and parts, 10 threads);
                  no check, no marker
  ckpt_restore    ckpt.load("s3://...") of the step (every tensor checked)
  boto3_restore   boto3's download_fileobj of the same objects into memory

Each item runs --reps times; medians. Prints one JSON line:
  {"bench": "object_tier", "bytes": ..., "upload_over_boto3": t_boto3/t_ckpt,
   "restore_over_boto3": ..., "step_slowdown_during_upload": null, ...}
(>1: ckpt moves the bytes faster than boto3). moto is a Python server and is
the bottleneck for both; against a real bucket (CKPT_BENCH_S3_URL, not run
here) the ratios would differ. `step_slowdown_during_upload`: the median time of a CPU
training step (matmuls) while a Checkpointer with tier= uploads each save
behind it (2 streams, 64 MiB/s each at most), over the same without a tier.
On this machine moto runs on the same cores, so the figure includes the
server's CPU, which a remote bucket would not cost.
"""
import argparse
import io
import json
import os
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


def step_slowdown(a, server, state, ckpt, torch):
    """A CPU training step (matmuls) timed while saving every 5 steps: once
    with a plain Checkpointer, once with tier= uploading each save behind it
    (rate capped). Returns the median step times and their ratio."""
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
        return statistics.median(times[5:])

    bucket = f"bench-{uuid.uuid4().hex[:10]}"
    server.stdin.write(f"bucket {bucket}\n")
    server.stdin.flush()
    assert server.stdout.readline().strip() == "ok"
    rate = 64 << 20
    base = train(os.path.join(a.dir, "train-plain"))
    tier = train(os.path.join(a.dir, "train-tier"), tier=f"s3://{bucket}/train", tier_streams=2,
                 tier_max_upload_rate=rate)
    if not a.keep:
        shutil.rmtree(os.path.join(a.dir, "train-plain"), ignore_errors=True)
        shutil.rmtree(os.path.join(a.dir, "train-tier"), ignore_errors=True)
    return {"base": round(base, 5), "tier": round(tier, 5), "ratio": round(tier / base, 3),
            "rate": rate}


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
        for rep in range(a.reps):
            bucket = f"bench-{uuid.uuid4().hex[:10]}"
            server.stdin.write(f"bucket {bucket}\n")
            server.stdin.flush()
            assert server.stdout.readline().strip() == "ok"
            root = os.path.join(a.dir, f"root{rep}")
            with ckpt.Checkpointer(root) as cp:
                cp.save_async(1, state)
                cp.save_async(2, {"x": torch.zeros(1)})
            step_dir = os.path.join(root, sorted(d for d in os.listdir(root) if d.startswith("step-"))[0])
            files = sorted(os.listdir(step_dir))
            # boto3 first (the ckpt run removes the local copy).
            t = time.perf_counter()
            for f in files:
                s3.upload_file(os.path.join(step_dir, f), bucket, f"boto/{f}", Config=transfer)
            times["boto3_upload"].append(time.perf_counter() - t)
            t = time.perf_counter()
            out = subprocess.run([retain, "--root", root, "--keep-last", "1", "--cold-dir",
                                  f"s3://{bucket}/ckpt"], env=env, capture_output=True, text=True)
            times["ckpt_upload"].append(time.perf_counter() - t)
            if out.returncode != 0:
                raise SystemExit(f"ckpt-retain failed: {out.stderr}")
            t = time.perf_counter()
            for f in files:
                buf = io.BytesIO()
                s3.download_fileobj(bucket, f"boto/{f}", buf, Config=transfer)
            times["boto3_restore"].append(time.perf_counter() - t)
            t = time.perf_counter()
            loaded = ckpt.load(f"s3://{bucket}/ckpt", step=1)
            times["ckpt_restore"].append(time.perf_counter() - t)
            assert torch.equal(loaded["layer0.w"], state["layer0.w"])
            if not a.keep:
                shutil.rmtree(root, ignore_errors=True)
        slowdown = step_slowdown(a, server, state, ckpt, torch)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(json.dumps({
            "bench": "object_tier", "server": "moto (loopback)", "bytes": total, "reps": a.reps,
            "upload_over_boto3": round(med["boto3_upload"] / med["ckpt_upload"], 3),
            "restore_over_boto3": round(med["boto3_restore"] / med["ckpt_restore"], 3),
            "step_slowdown_during_upload": slowdown["ratio"],
            "step_s_no_tier": slowdown["base"], "step_s_with_tier": slowdown["tier"],
            "tier_max_upload_rate": slowdown["rate"],
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
