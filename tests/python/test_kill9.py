"""kill -9 harness: a real writer process (the Python API, exact deltas on,
full_every=5) saves a small state in a loop and acknowledges each save once
`resp.result()` said it is durable; it is killed with SIGKILL at a random
moment. After every kill, `ckpt-restore --latest --verify` must succeed with a
step at least as new as every acknowledged one, and the next writer must open
the root at once (the writer lock died with the process). At the end the newest
checkpoint's values are the ones that step saved.

Rounds: CKPT_KILL9_ROUNDS (default 100, about a minute; the `python_kill9_slow`
ctest runs 400). Writers are forked from one helper process that has imported torch and
ckpt but run nothing, so a round costs a fork, not an interpreter start. The
counts (rounds, kills during a save, checkpoints committed) are printed.
"""
import json
import os
import random
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import ckpt

ROUNDS = int(os.environ.get("CKPT_KILL9_ROUNDS", "100"))

# The helper: reads "ROOT FIRST_STEP ACK_FILE" lines, forks a writer for each
# and answers with its pid. Writers never return.
ZYGOTE = textwrap.dedent("""
    import os, signal, sys
    import torch, ckpt
    sys.path.insert(0, sys.argv[1])
    import test_kill9 as k
    signal.signal(signal.SIGCHLD, lambda *_: k.reap())
    for line in sys.stdin:
        root, first, ack, point = line.split()
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            if point != "-":
                os.environ["CKPT_KILL_POINT"] = point  # read at the first kill point
            k.writer(root, int(first), ack)
            os._exit(0)
        print(pid, flush=True)
""")

N = 64 * 1024


def state_for(step):
    """The state saved at `step`: a function of the step alone, and a small
    change from step - 1 (so exact deltas are small)."""
    g = torch.Generator().manual_seed(1234)
    w = torch.randn(N, generator=g)
    b = torch.randn(257, generator=g).to(torch.bfloat16)
    for s in range(max(0, step - 20), step + 1):  # the last 20 steps' marks
        at = (s * 4099) % (N - 512)
        w[at:at + 512] = float(s)
    b[step % 257] = float(step % 100)
    return {"model": {"w": w, "b": b}, "step": step, "lr": 1e-3 / (1 + step)}


def reap():
    try:
        while True:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
    except ChildProcessError:
        pass


def writer(root, first, ack_path):
    ack = os.open(ack_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        cp = ckpt.Checkpointer(root, delta="exact", full_every=5)
    except Exception as e:  # noqa: BLE001 - reported to the harness
        os.write(ack, f"open-failed {type(e).__name__}: {e}\n".encode())
        os._exit(3)
    os.write(ack, b"open\n")
    step = first
    while True:
        resp = cp.save_async(step, state_for(step))
        resp.result()  # durable
        os.write(ack, f"{step}\n".encode())
        step += 1


def latest_verified(ckpt_restore, root):
    """The step `ckpt-restore --latest --verify` chooses, or None when there
    is no checkpoint at all."""
    proc = subprocess.run([ckpt_restore, "--root", root, "--latest", "--verify", "--json"],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode == 3 and not any(n.startswith("step-") for n in os.listdir(root)):
        return None
    assert proc.returncode == 0, f"ckpt-restore exited {proc.returncode}: {proc.stderr}"
    chosen = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    ok = [c for c in chosen if c.get("ok")]
    assert ok, proc.stdout
    return ok[-1]["step"]


def wait_gone(pid, deadline_s=30):
    """Waits until the killed writer is reaped, as a supervisor restarting a
    job waits (waitpid). A zombie leader is not enough: the process's other
    threads (a write in flight) may still be exiting, and its files (the
    writer lock) close only when the last one has."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if not os.path.exists(f"/proc/{pid}"):
            return
        time.sleep(0.002)
    raise AssertionError(f"writer {pid} not gone {deadline_s} s after SIGKILL")


def start_zygote():
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("CKPT_KILL_POINT", None)
    return subprocess.Popen([sys.executable, "-c", ZYGOTE, here], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)


def test_kill9_at_random_moments_loses_nothing_acknowledged(tmp_path, ckpt_restore):
    root = str(tmp_path / "root")
    zygote = start_zygote()
    rng = random.Random(9)
    kills_mid_save = committed_rounds = commits_unacked = temps_before = 0
    latest = None
    try:
        for r in range(ROUNDS):
            ack_path = str(tmp_path / f"ack{r}")
            first = 0 if latest is None else latest + 1
            zygote.stdin.write(f"{root} {first} {ack_path} -\n")
            zygote.stdin.flush()
            pid = int(zygote.stdout.readline())
            # Let it open (and, usually, save a few times), then kill it at a
            # random moment: during staging, writing, fsync, rename or idle.
            end = time.monotonic() + 120  # a loaded CI machine may take long to fork and open
            while time.monotonic() < end:
                if os.path.exists(ack_path) and os.path.getsize(ack_path) > 0:
                    break
                time.sleep(0.002)
            time.sleep(rng.uniform(0, 0.25))
            os.kill(pid, 9)
            wait_gone(pid)
            lines = open(ack_path).read().split("\n")
            assert lines[0] == "open", f"round {r}: the writer could not open the root: {lines[0]}"
            acked = [int(x) for x in lines[1:] if x.strip()]
            new_latest = latest_verified(ckpt_restore, root)
            if acked:
                assert new_latest is not None and new_latest >= max(acked), \
                    f"round {r}: step {max(acked)} was acknowledged durable, newest verified is {new_latest}"
            if latest is not None:
                assert new_latest is not None and new_latest >= latest, \
                    f"round {r}: newest verified went back from {latest} to {new_latest}"
            if new_latest != latest:
                committed_rounds += 1
            temps = sum(n.startswith(".tmp-") for n in os.listdir(root))
            if temps > temps_before:  # killed while a save was being written
                kills_mid_save += 1
            if acked and new_latest > max(acked):
                commits_unacked += 1  # killed between the commit and the acknowledgement
            temps_before = temps
            latest = new_latest
    finally:
        zygote.stdin.close()
        zygote.kill()
        zygote.wait(timeout=30)
    print(f"\nkill -9: {ROUNDS} rounds, {committed_rounds} committed something new, newest step "
          f"{latest}; {kills_mid_save} kills left a save half-written, {commits_unacked} landed "
          f"between a commit and its acknowledgement")
    assert latest is not None and latest >= ROUNDS // 4, "too few saves committed to test anything"
    got = ckpt.load(root, step=latest)
    want = state_for(latest)
    assert torch.equal(got["model"]["w"], want["model"]["w"])
    assert torch.equal(got["model"]["b"], want["model"]["b"])
    assert got["step"] == latest and got["lr"] == want["lr"]
    # The last writer's unfinished save goes when the next writer opens.
    with ckpt.Checkpointer(root):
        pass
    assert not [n for n in os.listdir(root) if n.startswith(".tmp-")], os.listdir(root)
    # Every checkpoint left verifies, deltas included.
    proc = subprocess.run([ckpt_restore, "--root", root, "--list", "--verify", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# The named kill points of the save and commit path (libckpt/src/util/kill_point.h),
# in order; from commit.root_synced on, the step being saved is durable.
KILL_POINTS = ["save.staged", "save.written", "save.synced", "commit.manifest",
               "commit.dir_synced", "commit.renamed", "commit.root_synced", "commit.latest",
               "commit.done"]
DURABLE_FROM = KILL_POINTS.index("commit.root_synced")


def test_kill9_at_every_named_point_of_save_and_commit(tmp_path, ckpt_restore):
    """Each writer is killed by the library itself (CKPT_KILL_POINT) at one
    named point of its 1st (full), 2nd or 3rd (exact delta) save. Before the
    rename the step being saved must not appear; once ROOT is fsynced it must;
    at the rename itself either. Every time: the newest checkpoint verifies,
    nothing acknowledged is lost, the next writer opens at once."""
    root = str(tmp_path / "root")
    zygote = start_zygote()
    latest = None
    seen = {}
    try:
        for i, point in enumerate(KILL_POINTS):
            for occurrence in (1, 2, 3):
                ack_path = str(tmp_path / f"ack-{i}-{occurrence}")
                first = 0 if latest is None else latest + 1
                zygote.stdin.write(f"{root} {first} {ack_path} {point}:{occurrence}\n")
                zygote.stdin.flush()
                pid = int(zygote.stdout.readline())
                wait_gone(pid, deadline_s=120)  # it kills itself, or the test fails here
                lines = open(ack_path).read().split("\n")
                assert lines[0] == "open", f"{point}:{occurrence}: could not open: {lines[0]}"
                acked = [int(x) for x in lines[1:] if x.strip()]
                assert len(acked) == occurrence - 1, \
                    f"{point}:{occurrence}: {len(acked)} saves acknowledged before the kill"
                killed_step = first + occurrence - 1
                new_latest = latest_verified(ckpt_restore, root)
                if acked:
                    assert new_latest is not None and new_latest >= max(acked)
                where = KILL_POINTS.index(point)
                if where >= DURABLE_FROM:
                    assert new_latest == killed_step, \
                        f"{point}:{occurrence}: step {killed_step} was durable, newest verified is {new_latest}"
                elif point != "commit.renamed":
                    assert new_latest == (max(acked) if acked else latest), \
                        f"{point}:{occurrence}: step {killed_step} appeared before its rename"
                seen[(point, occurrence)] = new_latest == killed_step
                latest = new_latest
    finally:
        zygote.stdin.close()
        zygote.kill()
        zygote.wait(timeout=30)
    print(f"\nkill points: {len(seen)} kills at {len(KILL_POINTS)} points; the step being saved "
          f"survived {sum(seen.values())} of them")
    with ckpt.Checkpointer(root):
        pass
    assert not [n for n in os.listdir(root) if n.startswith(".tmp-")], os.listdir(root)
    proc = subprocess.run([ckpt_restore, "--root", root, "--list", "--verify", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
