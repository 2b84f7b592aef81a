"""ckpt.load and ckpt.list_steps on s3:// roots, against moto's S3 server.

Checkpoints reach the bucket through `ckpt-retain --cold-dir s3://...` (the
commit protocol of docs/object-storage.md); reading them back from the bucket
gives the saved tensors bit for bit. A missing moto fails these tests: it is
installed by tools/setup.sh.
"""
import glob
import os
import shutil
import subprocess
import sys
import uuid

import pytest
import torch

import ckpt

REPO = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
SERVER = os.path.join(REPO, "tests", "object_store", "s3_server.py")


@pytest.fixture(scope="module")
def s3_endpoint():
    """moto's S3 server on 127.0.0.1 (a child process, stopped after)."""
    proc = subprocess.Popen([sys.executable, SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline().strip()  # the script exits at once if moto is missing
        assert line and not line.startswith("error"), f"moto S3 server did not start: {line!r}"
        endpoint = f"http://{line}"
        yield proc, endpoint
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


@pytest.fixture
def bucket_url(s3_endpoint, monkeypatch):
    proc, endpoint = s3_endpoint
    name = f"ckpt-py-{uuid.uuid4().hex[:12]}"
    proc.stdin.write(f"bucket {name}\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "ok"
    for key, value in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    return f"s3://{name}/run"


@pytest.fixture(scope="module")
def ckpt_retain():
    found = sorted(glob.glob(os.path.join(REPO, "build*", "tools", "ckpt-retain")),
                   key=os.path.getmtime, reverse=True)
    path = os.environ.get("CKPT_RETAIN") or (found[0] if found else shutil.which("ckpt-retain"))
    if not path or not os.path.exists(path):
        pytest.skip("ckpt-retain not built")
    return path


def save_and_tier(root, url, ckpt_retain, steps, **options):
    states = {}
    with ckpt.Checkpointer(root, **options) as cp:
        for s in steps:
            states[s] = {"w": torch.randn(5000, generator=torch.Generator().manual_seed(s)),
                         "b": torch.arange(s, s + 17, dtype=torch.int64), "step": s}
            cp.save_async(s, states[s])
    out = subprocess.run([ckpt_retain, "--root", root, "--keep-last", "1", "--cold-dir", url],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return states


def test_load_from_bucket_is_bit_identical(root, bucket_url, ckpt_retain):
    states = save_and_tier(root, bucket_url, ckpt_retain, [1, 2, 3, 4])
    assert ckpt.list_steps(root) == [4]
    assert ckpt.list_steps(bucket_url) == [1, 2, 3]
    for s in (1, 2, 3):
        got = ckpt.load(bucket_url, step=s)
        assert torch.equal(got["w"], states[s]["w"]) and torch.equal(got["b"], states[s]["b"])
        assert got["step"] == s
    step, newest = ckpt.load(bucket_url, with_step=True)
    assert step == 3 and torch.equal(newest["w"], states[3]["w"])
    into = {"w": torch.zeros(5000), "b": torch.zeros(17, dtype=torch.int64), "step": 0}
    ckpt.load(bucket_url, step=2, into=into)
    assert torch.equal(into["w"], states[2]["w"])


def test_delta_chain_restores_from_bucket(root, bucket_url, ckpt_retain):
    states = save_and_tier(root, bucket_url, ckpt_retain, [1, 2, 3, 4, 5],
                           delta="exact", full_every=3)
    steps = ckpt.list_steps(bucket_url)
    assert steps and 5 not in steps
    for s in steps:
        got = ckpt.load(bucket_url, step=s)
        assert torch.equal(got["w"], states[s]["w"]), s


def test_saving_to_a_bucket_is_refused_saying_what_to_do(bucket_url):
    with pytest.raises(Exception, match="ckpt-retain"):
        with ckpt.Checkpointer(bucket_url) as cp:
            cp.save_async(1, {"w": torch.zeros(3)})


def test_upload_behind_the_save_reports_each_step_durable_in_the_bucket(root, bucket_url):
    states = {}
    with ckpt.Checkpointer(root, delta="exact", full_every=2, tier=bucket_url) as cp:
        responses = []
        for s in (1, 2, 3):
            states[s] = {"w": torch.randn(4000, generator=torch.Generator().manual_seed(s)), "step": s}
            responses.append(cp.save_async(s, states[s]))
        for r in responses:
            done = r.tier_completion.result(timeout=120)
            assert done["durable_in_bucket"] and done["files"] >= 2, done
        assert cp.wait_tier(timeout=120)
        assert {s: v["state"] for s, v in cp.tier_status().items()} == {1: "durable", 2: "durable",
                                                                         3: "durable"}
    assert ckpt.list_steps(bucket_url) == [1, 2, 3]
    assert ckpt.list_steps(root) == [1, 2, 3]  # the local copies stay
    for s in (1, 2, 3):
        assert torch.equal(ckpt.load(bucket_url, step=s)["w"], states[s]["w"])


def test_close_uploads_what_was_committed(root, bucket_url):
    with ckpt.Checkpointer(root, tier=bucket_url) as cp:
        cp.save_async(7, {"w": torch.ones(10)})
    assert ckpt.list_steps(bucket_url) == [7]


def test_tier_arguments_are_checked(root):
    with pytest.raises(ValueError, match="s3://"):
        ckpt.Checkpointer(root, tier="/not/a/bucket")
    with pytest.raises(ValueError, match="tier_part_bytes"):
        ckpt.Checkpointer(root, tier="s3://b/p", tier_part_bytes=1024)
