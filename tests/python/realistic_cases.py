"""One realistic-state case: train a real model, save it several times through
ckpt.Checkpointer, load every committed step back and compare it with a deep
copy taken at save time. Runs inside a worker process (see serve()) so a save
that hangs can be reported and the process killed (test_realistic_states.py).

A case is a dict (JSON): workload, delta, topk_ratio, full_every, compression,
lazy, staging ("auto" | "lt_state" | "lt_tensor"), when_busy, change ("train"
| "none" | "sparse"), steps_between, saves, load ("new" | "into"), seed, and
optionally sizes (keyword arguments of the workload) and wait_s (how long any
one call may take before the case is declared hung).
"""
import faulthandler
import json
import os
import sys
import threading
import time
import traceback

import torch

import ckpt
from ckpt import _tree
import realistic_workloads as workloads
from training import assert_topk_restored

MiB = 1 << 20


class Hang(Exception):
    """A call did not return in time; the engine may be stuck, so the process
    must not try to close it."""


def with_deadline(what, timeout, fn, *args, **kwargs):
    """fn(*args, **kwargs) on a helper thread; raises Hang after `timeout` s."""
    box = {}

    def run():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 -- re-raised below
            box["error"] = e

    t = threading.Thread(target=run, daemon=True, name=f"deadline:{what}")
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise Hang(f"{what} did not return within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def staging_bytes_for(case, state):
    sizes = [t.numel() * t.element_size() for t in workloads.tensors_of(state)]
    return {"auto": None,
            "lt_state": max(1, sum(sizes) // 2),
            "lt_tensor": max(1, max(sizes) // 2)}[case["staging"]]


def run_case(case, root):
    """Runs `case` with checkpoints in `root`; returns a summary dict, raises
    AssertionError on a mismatch and Hang on a call that does not return."""
    wait_s = float(case.get("wait_s", 30))
    seed = int(case["seed"])
    w = workloads.make(case["workload"], seed, **case.get("sizes", {}))
    w.train(1)  # the optimizer has state from the first save on
    first = w.state()
    staging = staging_bytes_for(case, first)
    gen = torch.Generator().manual_seed(seed + 7)
    cp = ckpt.Checkpointer(root, delta=case["delta"], topk_ratio=case.get("topk_ratio", 0.01),
                           full_every=case.get("full_every", 3), lazy=case["lazy"],
                           staging_bytes=staging, compression=case["compression"],
                           when_busy=case["when_busy"])
    snapshots, responses, pending = {}, [], None

    def settle():  # the tensors may change only once the last save is staged
        if pending is not None:
            pending.staging_completion.result(timeout=wait_s)

    # A BatchNorm forward updates running_mean/var in place: with a lazy save
    # still copying, the forward must wait too (as a real loop's must).
    forward_mutates = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
                          for m in w.model.modules())
    t0 = time.perf_counter()
    try:
        for i in range(case["saves"]):
            if i > 0 and case["change"] == "train":
                if forward_mutates:
                    settle()
                w.forward_backward()  # otherwise overlaps a lazy save's copy
                settle()
                w.step()
                w.train(case["steps_between"] - 1)
            elif i > 0 and case["change"] == "sparse":
                settle()
                w.sparse_change(gen)
            step = 100 + i
            state = w.state()
            snapshots[step] = workloads.clone_tree(state)
            pending = with_deadline(f"save_async of step {step}", wait_s, cp.save_async, step, state)
            responses.append(pending)
        settle()
        results = {}
        for r in responses:
            try:
                results[r.step] = r.result(timeout=wait_s)
            except TimeoutError:
                raise Hang(f"save of step {r.step} not committed within {wait_s:g} s "
                           f"(saves {[s for s in results]} committed)") from None
        with_deadline("Checkpointer.close", wait_s, cp.close)
    except TimeoutError:
        raise Hang(f"staging of step {pending.step} not done within {wait_s:g} s") from None
    save_s = time.perf_counter() - t0

    committed = [s for s, st in results.items() if not st["skipped"]]
    assert ckpt.list_steps(root) == committed, (ckpt.list_steps(root), committed)
    if case["when_busy"] == "wait":
        assert len(committed) == case["saves"], "a save was skipped with when_busy=wait"
    kinds = {s: results[s]["kind"] for s in committed}
    assert kinds[committed[0]] == "full", kinds
    if case["delta"] == "none":
        assert set(kinds.values()) == {"full"}, kinds
    if case["delta"] == "exact" and case["change"] == "none":
        for s in committed[1:]:
            if kinds[s] == "delta":
                st = results[s]
                assert st["file_bytes"] <= st["tensor_bytes"] // 10 + 4096 * st["tensor_count"], \
                    f"step {s}: unchanged state gave a {st['file_bytes']} B delta of {st['tensor_bytes']} B"

    t0 = time.perf_counter()
    target = workloads.make(case["workload"], seed + 1000, **case.get("sizes", {})) \
        if case["load"] == "into" else None
    if target is not None:
        target.train(1)
    base = None  # name -> tensor: the restore of the last full step, a top-k delta's base
    ratio = case.get("topk_ratio", 0.01)
    for s in committed:
        bounds = {}
        if case["delta"] == "topk":
            bounds = {t["name"]: t.get("error_bound", 0.0) for t in ckpt.describe(root, s)["tensors"]}
        lossy = case["delta"] == "topk" and kinds[s] == "delta"
        check = dict(bounds=bounds, step=s, base=base if lossy else None, ratio=ratio)
        if target is not None:
            into = target.state()
            got = with_deadline(f"ckpt.load(step={s}, into=...)", wait_s, ckpt.load, root, step=s,
                                into=into)
            # The live model and optimizer now hold the checkpoint.
            live = {"model": target.model.state_dict(), "optim": target.optimizer.state_dict()}
            compare(live, {"model": snapshots[s]["model"], "optim": snapshots[s]["optim"]}, **check)
        else:
            got = with_deadline(f"ckpt.load(step={s})", wait_s, ckpt.load, root, step=s)
        compare(got, snapshots[s], **check)
        if kinds[s] == "full":
            names, tensors, _ = _tree.flatten(got)
            base = {n: t.detach().clone() for n, t in zip(names, tensors)}  # (a load into reuses them)
    newest, _ = with_deadline("ckpt.load(newest)", wait_s, ckpt.load, root, with_step=True)
    assert newest == committed[-1], (newest, committed)
    ckpt.verify(root, committed[-1])
    shards = max(len([f for f in os.listdir(results[s]["dir"]) if f.endswith(".shard")])
                 for s in committed)
    return {"bytes": workloads.state_bytes(first), "tensors": len(list(workloads.tensors_of(first))),
            "staging_bytes": staging, "shards": shards, "kinds": [kinds[s] for s in committed],
            "skipped": [s for s in results if s not in kinds],
            "file_bytes": [results[s]["file_bytes"] for s in committed],
            "save_s": round(save_s, 3), "load_s": round(time.perf_counter() - t0, 3)}


def compare(got, want, bounds, step, base=None, ratio=None):
    """Same structure and non-tensor leaves; tensors bit-identical, or for a
    top-k delta (base: name -> the restored tensor of its base step) floating
    tensors checked from the values (training.assert_topk_restored: the k
    largest changes kept, the error computed here) and within the bound the
    engine recorded (bounds: name -> error bound)."""
    gnames, gtensors, gmeta = _tree.flatten(got)
    wnames, wtensors, wmeta = _tree.flatten(want)
    assert gnames == wnames, f"step {step}: tensor names differ"
    assert gmeta == wmeta, f"step {step}: structure or non-tensor values differ"
    for name, g, x in zip(gnames, gtensors, wtensors):
        where = f"step {step}: {name}"
        assert g.dtype == x.dtype and g.shape == x.shape, \
            f"{where}: {g.dtype}{list(g.shape)} vs {x.dtype}{list(x.shape)}"
        if base is not None and x.is_floating_point() and x.numel():
            err = assert_topk_restored(x, g, base[name], ratio, where)
            bound = bounds[name]
            assert err <= bound * (1 + 1e-5) + 1e-6, f"{where}: error {err} over its bound {bound}"
        else:
            assert torch.equal(_bits(g), _bits(x)), f"{where}: not bit-identical"


def _bits(t):
    t = t.detach().contiguous()
    if t.numel() == 0:
        return torch.empty(0, dtype=torch.uint8)
    return t.reshape(-1).to(torch.uint8) if t.dtype == torch.bool else t.reshape(-1).view(torch.uint8)


def serve():
    """Worker loop: reads one JSON line {"case": ..., "root": ...} per case on
    stdin, writes one JSON reply line on the original stdout (everything else
    printed goes to stderr). After a Hang it replies and exits at once: the
    engine's threads may be stuck, so nothing may wait for them."""
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for line in sys.stdin:
        req = json.loads(line)
        try:
            info = run_case(req["case"], req["root"])
            reply = {"ok": True, "info": info}
        except Hang as e:
            reply = {"ok": False, "hang": True, "error": str(e)}
        except BaseException:  # noqa: BLE001 -- reported to the parent
            reply = {"ok": False, "hang": False, "error": traceback.format_exc()}
        proto.write(json.dumps(reply) + "\n")
        proto.flush()
        if reply.get("hang"):
            faulthandler.dump_traceback(all_threads=True)  # where it is stuck, into the log
            sys.stderr.flush()
            os._exit(3)


if __name__ == "__main__":
    serve()
