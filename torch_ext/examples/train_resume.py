#!/usr/bin/env python3
"""The README's main job: train, checkpoint asynchronously, crash, recover, resume.

    python3 torch_ext/examples/train_resume.py [--work DIR] [--steps 40]

1. Trains a small GPT-style transformer (torch.nn; Adam; synthetic tokens; CPU)
   for --steps steps, saving a checkpoint every --every steps through
   ckpt.Checkpointer(delta="exact"). At each save it prints how long the loop
   was blocked by ckpt next to torch.save of the same state, timed in the same run.
2. Runs the same training again in a child process and kills it with SIGKILL
   at step --kill-at, possibly while a save is in flight.
3. Recovers: `ckpt-restore --root ROOT --latest --verify` picks the newest
   checkpoint that fully verifies; ckpt.load reads it back.
4. Resumes from it in a fresh process and trains to --steps.
5. Checks that every resumed loss, and the final parameters and optimizer
   state (SHA-256 of their bytes), equal the uninterrupted run's.
6. Preemption: runs the training again with cp.handle_preemption() and sends
   it SIGTERM at step --term-at, as a scheduler would; the worker takes a
   final save at its next step boundary and exits by itself. Resumes from
   that final step and checks the same again. Exit 0 if all holds.

Needs the ckpt package (cmake --install, or PYTHONPATH=torch_ext/python with
a build tree) and ckpt-restore (on PATH, or --ckpt-restore).
"""
import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn

# -- the model and the data ----------------------------------------------------

VOCAB, SEQ, BATCH, D_MODEL, LAYERS, HEADS = 512, 32, 4, 192, 3, 4


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Parameter(torch.zeros(SEQ, D_MODEL))
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, 4 * D_MODEL, dropout=0.1,
                                           batch_first=True, norm_first=True)
        # (norm_first layers cannot use the nested-tensor fast path; say so, quietly)
        self.blocks = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB)
        self.register_buffer("mask", torch.triu(torch.full((SEQ, SEQ), float("-inf")), 1))

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos
        return self.head(self.norm(self.blocks(x, mask=self.mask)))


def batch(step):
    """Synthetic next-token data: a noisy arithmetic sequence per row, fixed per step."""
    g = torch.Generator().manual_seed(step)
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
    stride = torch.randint(1, 3, (BATCH, 1), generator=g)
    seq = (start + stride * torch.arange(SEQ + 1)) % VOCAB
    noise = torch.rand(seq.shape, generator=g) < 0.05
    seq = torch.where(noise, torch.randint(0, VOCAB, seq.shape, generator=g), seq)
    return seq[:, :-1], seq[:, 1:]


def state_of(model, optimizer, step):
    return {"model": model.state_dict(), "optim": optimizer.state_dict(), "step": step,
            "rng": torch.get_rng_state(), "config": {"vocab": VOCAB, "seq": SEQ, "d_model": D_MODEL}}


def digest(model, optimizer):
    """SHA-256 over the bytes of every parameter and optimizer-state tensor."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    for i, s in optimizer.state_dict()["state"].items():
        for k, t in s.items():
            h.update(f"{i}.{k}".encode())
            h.update(t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# -- the worker: one training process ---------------------------------------------


def worker(args):
    import ckpt

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = TinyGPT()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    first = 1
    if args.resume:
        step, state = ckpt.load(args.root, with_step=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
        torch.set_rng_state(state["rng"])
        first = state["step"] + 1
        emit({"event": "resumed", "step": state["step"]})
    torch_save_path = os.path.join(args.root, "..", f"torch_save-{os.getpid()}.pt")
    with ckpt.Checkpointer(args.root, delta="exact", full_every=4) as cp:
        if args.preemptible:
            cp.handle_preemption(grace_s=25)  # SIGTERM: finish, save, exit
        pending = None
        for step in range(first, args.steps + 1):
            t0 = time.perf_counter()
            tokens, targets = batch(step)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(tokens).reshape(-1, VOCAB), targets.reshape(-1))
            loss.backward()
            optimizer.step()
            emit({"event": "step", "step": step, "loss": loss.item(),
                  "step_ms": 1e3 * (time.perf_counter() - t0)})
            if args.preemptible and cp.preempted:
                t0 = time.perf_counter()
                stats = cp.save(step, state_of(model, optimizer, step))  # durable on return
                emit({"event": "preempted", "step": step, "kind": stats.get("kind", "full"),
                      "final_save_ms": 1e3 * (time.perf_counter() - t0)})
                break
            if step % args.every:
                continue
            if pending is not None and pending.done():
                report(pending)
                pending = None
            state = state_of(model, optimizer, step)
            resp = cp.save_async(step, state)  # returns once the state is staged
            line = {"event": "save", "step": step, "ckpt_blocked_ms": 1e3 * resp.blocked_s}
            if args.compare_torch_save:
                t0 = time.perf_counter()
                torch.save(state, torch_save_path)  # the same state, same run, same disk
                line["torch_save_ms"] = 1e3 * (time.perf_counter() - t0)
            emit(line)
            if pending is not None:
                report(pending)
            pending = resp
        if pending is not None:
            report(pending)
    if os.path.exists(torch_save_path):
        os.remove(torch_save_path)
    emit({"event": "done", "digest": digest(model, optimizer)})


def report(resp):
    stats = resp.result()  # raises if that save failed
    emit({"event": "committed", "step": resp.step, "kind": stats.get("kind", "full"),
          "file_mb": stats["file_bytes"] / 1e6, "tensor_mb": stats["tensor_bytes"] / 1e6,
          "seconds": stats["seconds"]})


def emit(obj):
    print(json.dumps(obj), flush=True)


# -- the driver --------------------------------------------------------------------


def run_worker(args, root, *, resume=False, compare=False, kill_at=None, term_at=None, on_line=None):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--root", root,
           "--steps", str(args.steps), "--every", str(args.every), "--threads", str(args.threads)]
    if resume:
        cmd.append("--resume")
    if compare:
        cmd.append("--compare-torch-save")
    if term_at is not None:
        cmd.append("--preemptible")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    events = []
    killed = False
    for raw in proc.stdout:
        ev = json.loads(raw)
        events.append(ev)
        if on_line:
            on_line(ev)
        if kill_at is not None and ev.get("event") == "step" and ev["step"] == kill_at:
            os.kill(proc.pid, signal.SIGKILL)  # no cleanup, no atexit, saves in flight die
            killed = True
            break
        if term_at is not None and ev.get("event") == "step" and ev["step"] == term_at:
            os.kill(proc.pid, signal.SIGTERM)  # as Slurm or Kubernetes would: then a grace
    rc = proc.wait()
    proc.stdout.close()
    if killed:
        say(f"  SIGKILL at step {kill_at} (exit status {rc})")
    elif rc != 0:
        sys.exit(f"train_resume: worker failed with exit status {rc}")
    return events


def say(text=""):
    print(text, flush=True)


def find_ckpt_restore(explicit):
    if explicit:
        return explicit
    path = shutil.which("ckpt-restore")
    if path:
        return path
    repo = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    for build in ("build", "build-torch"):
        p = os.path.join(repo, build, "tools", "ckpt-restore")
        if os.path.exists(p):
            return p
    sys.exit("train_resume: ckpt-restore not found (install it, or pass --ckpt-restore)")


def print_save_table(events):
    say(f"  {'step':>4}  {'ckpt blocked':>12}  {'torch.save':>10}  {'ratio':>6}   committed as")
    committed = {e["step"]: e for e in events if e["event"] == "committed"}
    ratios = []
    first = True
    for e in events:
        if e["event"] != "save":
            continue
        note = "  (first save: allocates the staging memory)" if first else ""
        first = False
        c = committed.get(e["step"])
        kind = f"{c['kind']:5} {c['file_mb']:6.2f} MB of {c['tensor_mb']:.2f} MB" if c else "-"
        ratio = e["torch_save_ms"] / max(e["ckpt_blocked_ms"], 1e-3)
        ratios.append(ratio)
        say(f"  {e['step']:>4}  {e['ckpt_blocked_ms']:9.2f} ms  {e['torch_save_ms']:7.1f} ms  "
            f"{ratio:5.1f}x   {kind}{note}")
    blocked = sorted(e["ckpt_blocked_ms"] for e in events if e["event"] == "save")
    saves = sorted(e["torch_save_ms"] for e in events if e["event"] == "save")
    if blocked:
        say(f"  median: ckpt blocked the loop {blocked[len(blocked) // 2]:.2f} ms per save, "
            f"torch.save {saves[len(saves) // 2]:.1f} ms")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", help="working directory (default: a new temp dir, removed at the end)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=4)
    p.add_argument("--kill-at", type=int, default=26)
    p.add_argument("--term-at", type=int, default=None,
                   help="step at which the preempted run gets SIGTERM (default: 0.4 x --steps + 1)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads in each training process (1 leaves a core to the background writer)")
    p.add_argument("--ckpt-restore", help="path of ckpt-restore (default: PATH, then the build tree)")
    # internal: one training process
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--preemptible", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--compare-torch-save", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.term_at is None:
        args.term_at = args.steps * 2 // 5 + 1
    if not 1 <= args.term_at < args.steps:
        p.error(f"--term-at {args.term_at} must be in 1..{args.steps - 1}")

    import ckpt  # noqa: F401 -- fail early if the package is missing
    restore_tool = find_ckpt_restore(args.ckpt_restore)
    work = args.work or tempfile.mkdtemp(prefix="ckpt-train-resume-", dir=os.environ.get("TMPDIR"))
    os.makedirs(work, exist_ok=True)
    root_a, root_b = os.path.join(work, "uninterrupted"), os.path.join(work, "crashed")
    for r in (root_a, root_b):
        shutil.rmtree(r, ignore_errors=True)
    n_params = sum(p.numel() for p in TinyGPT().parameters())
    say(f"train_resume: {LAYERS}-layer transformer, {n_params / 1e6:.2f} M parameters, Adam, "
        f"{args.steps} steps, checkpoint every {args.every} (exact deltas, full every 4th), "
        f"torch {torch.__version__}, ckpt from {os.path.dirname(ckpt.__file__)}")
    started = time.perf_counter()

    say("\n[1/5] uninterrupted run, timing each checkpoint against torch.save of the same state")
    run_a = run_worker(args, root_a, compare=True)
    print_save_table(run_a)
    losses_a = {e["step"]: e["loss"] for e in run_a if e["event"] == "step"}
    step_ms = sorted(e["step_ms"] for e in run_a if e["event"] == "step")
    say(f"  training: loss {losses_a[1]:.3f} at step 1 -> {losses_a[args.steps]:.3f} at step {args.steps}, "
        f"median {step_ms[len(step_ms) // 2]:.0f} ms per step")
    digest_a = next(e["digest"] for e in run_a if e["event"] == "done")

    say(f"\n[2/5] the same run in a child process, killed with SIGKILL at step {args.kill_at}")
    run_worker(args, root_b, kill_at=args.kill_at)
    say(f"  left behind in {root_b}: {', '.join(sorted(os.listdir(root_b)))}")

    say(f"\n[3/5] recovery: {os.path.basename(restore_tool)} --root {root_b} --latest --verify")
    out = subprocess.run([restore_tool, "--root", root_b, "--latest", "--verify"],
                         capture_output=True, text=True)
    for line in (out.stdout + out.stderr).strip().splitlines():
        say("  | " + line)
    if out.returncode != 0:
        sys.exit(f"train_resume: ckpt-restore failed with exit status {out.returncode}")
    step, state = ckpt.load(root_b, with_step=True)
    say(f"  ckpt.load: step {step}, {len(state['model'])} model tensors, "
        f"{len(state['optim']['state'])} optimizer-state entries (int keys: "
        f"{all(isinstance(k, int) for k in state['optim']['state'])})")

    say(f"\n[4/5] resume from step {step} in a fresh process, train to step {args.steps}")
    run_c = run_worker(args, root_b, resume=True)
    resumed_from = next(e["step"] for e in run_c if e["event"] == "resumed")
    losses_c = {e["step"]: e["loss"] for e in run_c if e["event"] == "step"}
    digest_c = next(e["digest"] for e in run_c if e["event"] == "done")

    say(f"\n  {'step':>4}  {'uninterrupted loss':>20}  {'resumed loss':>20}")
    shown = [s for s in sorted(losses_c) if s <= resumed_from + 3 or s > args.steps - 3]
    mismatched = [s for s in losses_c if losses_c[s] != losses_a[s]]
    for s in shown:
        say(f"  {s:>4}  {losses_a[s]!r:>20}  {losses_c[s]!r:>20}  {'==' if losses_c[s] == losses_a[s] else '!='}")
    say(f"  final parameters + optimizer state, SHA-256: uninterrupted {digest_a[:16]}…, "
        f"resumed {digest_c[:16]}…")
    ok = not mismatched and digest_a == digest_c and resumed_from == step

    root_p = os.path.join(work, "preempted")
    shutil.rmtree(root_p, ignore_errors=True)
    say(f"\n[5/5] preemption: a run with cp.handle_preemption(grace_s=25) gets SIGTERM at step "
        f"{args.term_at}")
    run_p = run_worker(args, root_p, term_at=args.term_at)
    final = next((e for e in run_p if e["event"] == "preempted"), None)
    if final is None:
        sys.exit("train_resume: the preempted run did not take a final save")
    latest = ckpt.list_steps(root_p)[-1]
    say(f"  final save of step {final['step']} ({final['kind']}) durable {final['final_save_ms']:.0f} ms "
        f"after the loop saw the signal; the worker exited by itself; newest checkpoint: step {latest}; "
        f"left behind: {', '.join(sorted(os.listdir(root_p)))}")
    run_q = run_worker(args, root_p, resume=True)
    losses_q = {e["step"]: e["loss"] for e in run_q if e["event"] == "step"}
    digest_q = next(e["digest"] for e in run_q if e["event"] == "done")
    resumed_q = next(e["step"] for e in run_q if e["event"] == "resumed")
    mismatched_q = [s for s in losses_q if losses_q[s] != losses_a[s]]
    say(f"  resumed from step {resumed_q}: {len(losses_q) - len(mismatched_q)} of {len(losses_q)} losses "
        f"and the final state ({digest_q[:16]}…) {'equal' if not mismatched_q and digest_q == digest_a else 'differ from'} "
        f"the uninterrupted run's")
    ok = ok and not mismatched_q and digest_q == digest_a and resumed_q == final["step"] == latest
    elapsed = time.perf_counter() - started
    if ok:
        say(f"\nOK: resumed from step {resumed_from} after SIGKILL and from step {resumed_q} after "
            f"SIGTERM; every resumed loss and the final state are bit-identical to the uninterrupted "
            f"run ({elapsed:.0f} s)")
    else:
        say(f"\nFAIL: {len(mismatched) + len(mismatched_q)} losses differ "
            f"(first: step {min(mismatched + mismatched_q) if mismatched + mismatched_q else '-'}), "
            f"digests {'equal' if digest_a == digest_c == digest_q else 'differ'}")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
