"""Realistic training states through ckpt.Checkpointer, saved between real
training steps and loaded back bit-exact (top-k: within the recorded bound).

Workloads (realistic_workloads.py): a GPT trained with AdamW (5000+ token
vocabulary, untied head, LayerNorm; exp_avg, exp_avg_sq, 0-d step tensors), the
same with bf16 blocks and an fp16 buffer, a ResNet with BatchNorm trained with
SGD + momentum, 10,000 tiny tensors, and one tensor larger than the staging
memory. They are crossed with the Checkpointer's options (delta, compression,
lazy, staging_bytes, when_busy) and the change between saves (training steps,
none, a sparse edit) and the load (new tensors, in place) by a pairwise
covering design, plus the risky combinations (more than 8 shard files x
deltas/zstd x small staging) and seeded random cases.

Each case runs in a worker process (realistic_cases.py) and every call there
has a deadline: a save that never completes fails its case with the call that
hung, and the worker is replaced. The default run takes about 2-3 minutes on 2
cores; CKPT_SLOW_TESTS=1 adds the full cross of the risky combinations and
CKPT_REALISTIC_SEEDS (default 40 there) random cases.
"""
import itertools
import json
import os
import queue
import random
import subprocess
import sys
import threading

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
SLOW = os.environ.get("CKPT_SLOW_TESTS") == "1"
slow = pytest.mark.skipif(not SLOW, reason="slow: set CKPT_SLOW_TESTS=1")

FACTORS = {
    "workload": ["gpt", "gpt_mixed", "resnet", "tiny10k", "bigtensor"],
    "delta": ["none", "exact", "topk"],
    "staging": ["auto", "lt_state", "lt_tensor"],
    "change": ["train", "none", "sparse"],
    "compression": [0, 1],
    "lazy": [False, True],
    "when_busy": ["wait", "skip"],
    "load": ["new", "into"],
}
DEFAULTS = {"saves": 3, "steps_between": 1, "full_every": 3, "topk_ratio": 0.05, "seed": 0,
            "wait_s": 30}


def case_id(c):
    parts = [c["workload"], c["delta"], f"z{c['compression']}", "lazy" if c["lazy"] else "eager",
             c["staging"], c["when_busy"], c["change"], c["load"]]
    return "-".join(str(p) for p in parts)


def _pairs(row):
    names = sorted(row)
    return {(a, row[a], b, row[b]) for a, b in itertools.combinations(names, 2)}


def pairwise(factors, seed=0, tries=20):
    """A covering array of strength 2 (AETG-style greedy): every pair of values
    of every two factors appears in some row. Deterministic for a seed."""
    rng = random.Random(seed)
    names = sorted(factors)
    uncovered = set()
    for a, b in itertools.combinations(names, 2):
        uncovered |= {(a, va, b, vb) for va in factors[a] for vb in factors[b]}
    rows = []
    while uncovered:
        a, va, b, vb = min(uncovered, key=repr)
        best, gain = None, -1
        for _ in range(tries):
            row = {a: va, b: vb}
            for n in rng.sample([n for n in names if n not in row], len(names) - 2):
                def score(v):
                    trial = dict(row, **{n: v})
                    return sum(p in uncovered for p in _pairs(trial) if n in (p[0], p[2]))
                values = list(factors[n])
                rng.shuffle(values)
                row[n] = max(values, key=score)
            g = len(_pairs(row) & uncovered)
            if g > gain:
                best, gain = row, g
        rows.append(best)
        uncovered -= _pairs(best)
    return [dict(DEFAULTS, seed=i, **{n: r[n] for n in factors}) for i, r in enumerate(rows)]


def random_case(seed):
    """A random case: random options, sizes, chain lengths and ratios."""
    rng = random.Random(seed)
    c = {n: rng.choice(v) for n, v in FACTORS.items()}
    sizes = {"gpt": lambda: {"vocab": rng.choice([1000, 5000, 8192]), "d": rng.choice([32, 64, 128]),
                             "layers": rng.randint(1, 4), "heads": rng.choice([2, 4])},
             "resnet": lambda: {"widths": rng.choice([(8, 16), (16, 32, 64)]), "blocks": rng.randint(1, 2)},
             "tiny10k": lambda: {"layers": rng.choice([300, 1250])},
             "bigtensor": lambda: {"rows": rng.choice([8192, 32768]), "d": rng.choice([64, 128])}}
    c["sizes"] = sizes["gpt" if c["workload"].startswith("gpt") else c["workload"]]()
    c.update(saves=rng.randint(2, 4), steps_between=rng.randint(1, 3), full_every=rng.randint(1, 4),
             topk_ratio=rng.choice([0.01, 0.05, 0.3]), seed=seed, wait_s=30)
    return c


def risky(delta, compression, staging, lazy=False, workload="gpt_shards"):
    """More than 8 shard files (gpt_shards: ~165 MB in 10 shards)."""
    return dict(DEFAULTS, workload=workload, delta=delta, compression=compression, staging=staging,
                lazy=lazy, when_busy="wait", change="train", load="new", wait_s=20)


PAIRWISE = pairwise(FACTORS)
RISKY = [risky("exact", 0, "auto"),             # many shards x exact delta
         risky("none", 1, "lt_state"),          # many shards x zstd x staging < state
         risky("topk", 1, "lt_state", lazy=True),
         risky("exact", 1, "lt_tensor", workload="bigtensor"),  # delta x a tensor > staging
         risky("topk", 0, "lt_tensor", lazy=True, workload="bigtensor")]
RISKY_ALL = [risky(d, z, s, lazy) for d, z, s, lazy in itertools.product(
    ["none", "exact", "topk"], [0, 1], ["auto", "lt_state", "lt_tensor"], [False, True])]
RISKY_ALL = [c for c in RISKY_ALL if c not in RISKY]
DEFAULT_SEEDS = [11, 12, 13]
SLOW_SEEDS = range(100, 100 + int(os.environ.get("CKPT_REALISTIC_SEEDS", "40")))


class Worker:
    """A `realistic_cases.py` process running one case at a time."""

    def __init__(self, log_path):
        env = dict(os.environ)
        paths = [HERE]
        if os.environ.get("CKPT_TEST_INSTALLED") != "1":
            paths.append(os.path.join(REPO, "torch_ext", "python"))
        env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [env.get("PYTHONPATH")] if p])
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "realistic_cases.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, env=env, text=True)
        self.replies = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.replies.put(json.loads(line))
        self.replies.put(None)

    def alive(self):
        return self.proc.poll() is None

    def run(self, case, root, timeout):
        start = os.path.getsize(self.log_path)
        self.proc.stdin.write(json.dumps({"case": case, "root": root}) + "\n")
        self.proc.stdin.flush()
        try:
            reply = self.replies.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            reply = {"ok": False, "hang": True,
                     "error": f"no reply within {timeout:g} s: worker killed"}
        if reply is None:
            reply = {"ok": False, "hang": False,
                     "error": f"worker exited with status {self.proc.wait()}"}
        elif reply.get("hang"):
            self.proc.wait(timeout=30)  # it exits after a hang
        with open(self.log_path, "rb") as f:
            f.seek(start)
            reply["log"] = f.read().decode(errors="replace")[-4000:]
        return reply

    def kill(self):
        if self.alive():
            self.proc.kill()
        self.proc.wait()

    def close(self):
        if self.alive():
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


@pytest.fixture(scope="module")
def run_case(tmp_path_factory):
    """run_case(case, root): runs `case` in a live worker (starting a new one
    after a hang) and fails the test with the worker's message and log."""
    log = str(tmp_path_factory.mktemp("realistic") / "worker.log")
    workers = []

    def run(case, root):
        if not workers or not workers[-1].alive():
            workers.append(Worker(log))
        reply = workers[-1].run(case, root, timeout=6 * case["wait_s"] + 60)
        if not reply["ok"]:
            what = "HANG" if reply.get("hang") else "FAILED"
            pytest.fail(f"{what}: {case_id(case)}\n{reply['error']}\n--- worker log ---\n{reply['log']}",
                        pytrace=False)
        return reply["info"]

    yield run
    for w in workers:
        w.close()


def _check(run_case, root, case):
    info = run_case(case, root)
    print(case_id(case), json.dumps(info))
    if case["workload"] == "gpt_shards":
        assert info["shards"] > 8, info


@pytest.mark.parametrize("case", PAIRWISE, ids=case_id)
def test_pairwise(run_case, root, case):
    _check(run_case, root, case)


@pytest.mark.parametrize("case", RISKY, ids=case_id)
def test_risky(run_case, root, case):
    _check(run_case, root, case)


@pytest.mark.parametrize("seed", DEFAULT_SEEDS)
def test_random(run_case, root, seed):
    _check(run_case, root, random_case(seed))


@slow
@pytest.mark.slow
@pytest.mark.parametrize("case", RISKY_ALL, ids=case_id)
def test_risky_all(run_case, root, case):
    _check(run_case, root, case)


@slow
@pytest.mark.slow
@pytest.mark.parametrize("seed", SLOW_SEEDS)
def test_random_many(run_case, root, seed):
    _check(run_case, root, random_case(seed))


def test_design_covers_every_pair():
    covered = set().union(*(_pairs({n: c[n] for n in FACTORS}) for c in PAIRWISE))
    for a, b in itertools.combinations(sorted(FACTORS), 2):
        for va, vb in itertools.product(FACTORS[a], FACTORS[b]):
            assert (a, va, b, vb) in covered, (a, va, b, vb)
