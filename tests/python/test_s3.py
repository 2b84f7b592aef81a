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
import time
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


def _until(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_uploads_wait_while_a_retention_job_holds_the_lease(root, bucket_url):
    # ckpt-retain tiering into the same prefix holds its lease: the upload
    # behind the save waits for it (not three quick tries and a failure),
    # then goes up once the job ends.
    retention = torch.classes.ckpt.TierLease(bucket_url, "ckpt-retain pid 1 on cron", 300.0)
    with ckpt.Checkpointer(root, tier=bucket_url) as cp:
        r = cp.save_async(1, {"w": torch.ones(10)})
        r.result(timeout=60)
        _until(lambda: cp.tier_status(1)["state"] == "uploading")
        time.sleep(3)  # longer than the tries' pauses (0.5 s + 1 s)
        assert cp.tier_status(1)["state"] == "uploading"
        assert ckpt.list_steps(bucket_url) == []
        retention.release()
        done = r.tier_completion.result(timeout=120)
        assert done["durable_in_bucket"], done
    assert ckpt.list_steps(bucket_url) == [1]


def test_a_lease_held_past_tier_lease_wait_fails_the_upload_naming_its_holder(root, bucket_url):
    retention = torch.classes.ckpt.TierLease(bucket_url, "ckpt-retain pid 1 on cron", 300.0)
    try:
        cp = ckpt.Checkpointer(root, tier=bucket_url, tier_lease_wait=2)
        r = cp.save_async(1, {"w": torch.ones(10)})
        with pytest.raises(ckpt.CheckpointError, match=r"held by ckpt-retain pid 1 on cron.*\(waited \d+ s"):
            r.tier_completion.result(timeout=120)
        assert cp.tier_status(1)["state"] == "failed"
        # A wait in progress ends at once on close(cancel=True); the save stands.
        r = cp.save_async(2, {"w": torch.ones(10)})
        r.result(timeout=60)
        _until(lambda: cp.tier_status(2)["state"] == "uploading")
        start = time.monotonic()
        cp.close(cancel=True)
        assert time.monotonic() - start < 5
        assert cp._tier.status(2)["state"] == "cancelled"
    finally:
        retention.release()
    assert ckpt.list_steps(bucket_url) == [] and ckpt.list_steps(root) == [1, 2]


def test_tier_arguments_are_checked(root):
    with pytest.raises(ValueError, match="s3://"):
        ckpt.Checkpointer(root, tier="/not/a/bucket")
    with pytest.raises(ValueError, match="tier_part_bytes"):
        ckpt.Checkpointer(root, tier="s3://b/p", tier_part_bytes=1024)
    with pytest.raises(ValueError, match="tier_storage_class: storage class GLACIER: .*restore request"):
        ckpt.Checkpointer(root, tier="s3://b/p", tier_storage_class="GLACIER")
    with pytest.raises(ValueError, match="not a storage class name"):
        ckpt.Checkpointer(root, tier="s3://b/p", tier_storage_class="standard_ia")
    for wait in (-1, float("nan"), float("inf"), "10", True):
        with pytest.raises(ValueError, match="tier_lease_wait"):
            ckpt.Checkpointer(root, tier="s3://b/p", tier_lease_wait=wait)


def test_upload_behind_the_save_stores_objects_in_the_storage_class_asked_for(root, bucket_url):
    w = torch.randn(3 << 20)  # 12 MiB: a multipart upload of 5 MiB parts
    with ckpt.Checkpointer(root, tier=bucket_url, tier_part_bytes=5 << 20,
                           tier_storage_class="STANDARD_IA") as cp:
        cp.save_async(1, {"w": w, "b": torch.ones(3)})
        assert cp.wait_tier(timeout=120)
        assert cp.tier_status(1)["state"] == "durable", cp.tier_status(1)
    s3, bucket, prefix = _client_of(bucket_url)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")["Contents"]]
    data = [k for k in keys if "/step-" in k and not k.endswith(".commit")]  # the step's objects, no marker
    assert any(s3.head_object(Bucket=bucket, Key=k)["ContentLength"] > 5 << 20 for k in data), keys
    for k in data:
        assert s3.head_object(Bucket=bucket, Key=k).get("StorageClass") == "STANDARD_IA", k
    marker = [k for k in keys if k.endswith(".commit")]
    assert len(marker) == 1 and s3.head_object(Bucket=bucket, Key=marker[0]).get("StorageClass", "STANDARD") == "STANDARD"
    assert torch.equal(ckpt.load(bucket_url, step=1)["w"], w)


def _aws_env():
    return {k: os.environ[k] for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                       "AWS_REGION")}


def _client_of(url):
    """(a boto3 client of the test's moto server, bucket, prefix) of `url`."""
    import boto3
    bucket, prefix = url[len("s3://"):].split("/", 1)
    return boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1"), bucket, prefix


def _marker(url, step):
    """The commit marker of `step` under `url` (moto, through boto3), or None."""
    import botocore
    s3, bucket, prefix = _client_of(url)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/").get("Contents", [])]
    marker = [k for k in keys if k == f"{prefix}/step-{step:020d}.commit"]  # ckpt/object_tier.h's MarkerKey
    try:
        return keys, (s3.get_object(Bucket=bucket, Key=marker[0])["Body"].read().decode() if marker else None)
    except botocore.exceptions.ClientError:
        return keys, None


def test_upload_behind_a_multi_rank_save_commits_one_checkpoint_per_step(root, bucket_url, tmp_path):
    """Two ranks, tier=: each uploads its own part, one marker per step after
    both; the bucket's checkpoints load back on the group as saved, and each
    rank's part from the bucket is the local one bit for bit."""
    import distributed_workers as workers
    w = workers.run_world("tier_workers:tier_group", 2, str(tmp_path / "w"), timeout=300, root=root,
                          url=bucket_url, aws=_aws_env(), broken_rank=None)
    w.check()
    for r in range(2):
        v = w.value(r)
        assert v["errors"] == [], f"rank {r}: " + "\n".join(v["errors"])
        assert v["waited"] and v["status"] == {"1": "durable", "2": "durable", "3": "durable"}, v
        for d in v["done"]:
            assert d.get("durable_in_bucket") and d["files"] >= 5 and d["rank_bytes"] > 0, d
    # Both ranks uploaded: each one's bytes are its own part's.
    assert w.value(0)["done"][0]["rank_bytes"] != w.value(0)["done"][0]["bytes"]
    assert ckpt.list_steps(bucket_url) == [1, 2, 3]
    for s in (1, 2, 3):
        keys, marker = _marker(bucket_url, s)
        assert marker is not None, keys
        local = sorted(os.listdir(ckpt.describe(root, s)["dir"]))
        for name in local:  # the marker lists every file of the step, both ranks' and the global manifest
            assert f'"{name}"' in marker, (name, marker)
        for r in range(2):
            a, b = ckpt.load(bucket_url, step=s, rank=r), ckpt.load(root, step=s, rank=r)
            assert torch.equal(a["model"]["w"], b["model"]["w"]) and torch.equal(a["rng"], b["rng"]), (s, r)


def test_ranks_that_share_no_file_system_commit_one_checkpoint_in_the_bucket(root, bucket_url, tmp_path):
    """shared_root=False: each rank commits its own copy (the manifest and its
    part only) under ROOT/rank-<r> and uploads it; one marker per step makes
    the bucket hold every whole step. Loaded from the bucket alone (the local
    copies gone) every rank's part is as saved, and each rank keeps only the
    newest durable step's delta chain locally."""
    import distributed_workers as workers
    import tier_workers
    w = workers.run_world("tier_workers:tier_node_local", 2, str(tmp_path / "w"), timeout=300, root=root,
                          url=bucket_url, aws=_aws_env())
    w.check()
    for r in range(2):
        v = w.value(r)
        assert v["errors"] == [] and v["foreign"] == [], f"rank {r}: {v}"
        assert v["local_dir"] == os.path.join(root, f"rank-{r:05d}"), v["local_dir"]
        assert v["waited"] and v["status"] == {str(s): "durable" for s in (1, 2, 3, 4)}, v
        # Steps 1 and 2 are in the bucket and step 4 is a delta of 3: only 3 and 4 stay here.
        assert [n for n in v["left"] if n.startswith("step-")] == [f"step-{s:020d}" for s in (3, 4)], v["left"]
    assert ckpt.list_steps(bucket_url) == [1, 2, 3, 4]
    for s in (1, 2, 3, 4):
        keys, marker = _marker(bucket_url, s)
        assert marker is not None and '"rank-00000.MANIFEST.json"' in marker and \
            '"rank-00001.MANIFEST.json"' in marker, keys
    shutil.rmtree(root)  # the machines are gone: the bucket alone restores every step
    for s in (1, 2, 3, 4):
        for r in range(2):
            got, want = ckpt.load(bucket_url, step=s, rank=r), tier_workers._state(r, s)
            assert torch.equal(got["model"]["w"], want["model"]["w"]) and torch.equal(got["rng"], want["rng"]), (s, r)
    ckpt.verify(bucket_url, 4)


def test_a_multi_rank_upload_waits_for_a_retention_jobs_lease(root, bucket_url, tmp_path):
    """Rank 0 takes the lease for the group: while a ckpt-retain run holds
    it, the group's uploads wait (no marker, no failure), then every step
    goes up once it is released."""
    import threading

    import distributed_workers as workers
    retention = torch.classes.ckpt.TierLease(bucket_url, "ckpt-retain pid 1 on cron", 300.0)
    result = {}
    world = threading.Thread(target=lambda: result.update(w=workers.run_world(
        "tier_workers:tier_group", 2, str(tmp_path / "w"), timeout=300, root=root, url=bucket_url,
        aws=_aws_env(), broken_rank=None)))
    world.start()
    try:
        _until(lambda: 1 in ckpt.list_steps(root) if os.path.isdir(root) else False, timeout=120)
        time.sleep(3)  # longer than the tries' pauses (0.5 s + 1 s)
        assert ckpt.list_steps(bucket_url) == []
    finally:
        retention.release()
        world.join(timeout=320)
    w = result["w"]
    w.check()
    for r in range(2):
        v = w.value(r)
        assert v["errors"] == [], f"rank {r}: " + "\n".join(v["errors"])
        assert v["waited"] and v["status"] == {"1": "durable", "2": "durable", "3": "durable"}, v
    assert ckpt.list_steps(bucket_url) == [1, 2, 3]


def test_a_save_that_failed_on_one_rank_ends_the_others_upload_at_once(root, bucket_url, tmp_path):
    import distributed_workers as workers
    w = workers.run_world("tier_workers:tier_failed_save_on_one_rank", 2, str(tmp_path / "w"), timeout=300,
                          root=root, url=bucket_url, aws=_aws_env())
    w.check()
    for r in range(2):
        for rnd in w.value(r)["rounds"]:
            assert rnd["seconds"] < 30, rnd  # not the hour the group's patience allows
            if rnd["failing"] == r:
                assert rnd == {"failing": r, "seconds": rnd["seconds"], "uploaded": False,
                               "reason": "the save failed: injected"}, rnd
            elif r == 0:  # rank 0 writes no marker, naming rank 1
                assert "rank 1: its save failed: the save failed: injected" in rnd["error"], rnd
            else:  # rank 1 hears from rank 0 in place of its "go"
                assert "rank 0's save of the step failed: the save failed: injected" in rnd["error"], rnd


def test_shared_root_false_needs_a_tier(root):
    with pytest.raises(TypeError, match="shared_root"):
        ckpt.Checkpointer(root, shared_root="no")
    # Without a group it means nothing: a single-process checkpointer.
    with ckpt.Checkpointer(root, shared_root=False) as cp:
        assert cp.shared_root and cp.local_dir == root


def test_a_rank_whose_part_cannot_upload_leaves_no_marker_and_fails_on_every_rank(root, bucket_url, tmp_path):
    import distributed_workers as workers
    w = workers.run_world("tier_workers:tier_group", 2, str(tmp_path / "w"), timeout=300, root=root,
                          url=bucket_url, aws=_aws_env(), broken_rank=1)
    w.check()
    for r in range(2):
        v = w.value(r)
        assert v["status"] == {"1": "failed", "2": "failed", "3": "failed"}, v
        for d in v["done"]:
            assert "error" in d, d
        # Step 1 names rank 1's part; the deltas after it, their missing base.
        assert "rank 1" in v["done"][0]["error"], v["done"][0]
    assert ckpt.list_steps(bucket_url) == []
    for s in (1, 2, 3):
        assert _marker(bucket_url, s)[1] is None
    assert ckpt.list_steps(root) == [1, 2, 3]  # the local checkpoints stand
