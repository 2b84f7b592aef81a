"""Workers for test_cuda.py: each case runs in its own process, so that the
CUDA caching allocator's configuration (PYTORCH_CUDA_ALLOC_CONF, read once
when CUDA starts) differs between runs and the pytest process never starts
CUDA itself.

    python3 cuda_workers.py CASE ROOT

Exit 0 when the case held; an AssertionError's traceback otherwise.
"""
import os
import sys

import torch
import torch.nn.functional as F

import ckpt  # noqa: E402  (the package under test: test_cuda.py sets PYTHONPATH)
from realistic_workloads import GPT  # this script's folder is on sys.path

DEVICE = "cuda"


class Trainer:
    """A GPT with AdamW on the GPU, fed batches that depend only on the step."""

    def __init__(self, seed, vocab=16384, d=256, layers=4, heads=4, seq=64, batch=8):
        torch.manual_seed(seed)
        self.model = GPT(vocab, d, layers, heads, seq).to(DEVICE)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, weight_decay=0.1)
        self.vocab, self.seq, self.batch = vocab, seq, batch
        self.step = 0

    def forward_backward(self):
        g = torch.Generator().manual_seed(10_000 + self.step)
        tokens = torch.randint(self.vocab, (self.batch, self.seq + 1), generator=g).to(DEVICE)
        self.opt.zero_grad(set_to_none=True)
        logits = self.model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, self.vocab).float(), tokens[:, 1:].reshape(-1))
        loss.backward()
        return loss

    def optimizer_step(self):
        self.opt.step()
        self.step += 1

    def train(self, steps):
        losses = []
        for _ in range(steps):
            losses.append(self.forward_backward().detach())
            self.optimizer_step()
        return [float(x) for x in losses]

    def state(self):
        return {"model": self.model.state_dict(), "optim": self.opt.state_dict(), "step": self.step}


def gpu_tensors(tree, prefix=""):
    """name -> tensor for every CUDA tensor in a nested state."""
    out = {}
    if isinstance(tree, torch.Tensor):
        out[prefix] = tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            out.update(gpu_tensors(v, f"{prefix}/{k}"))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            out.update(gpu_tensors(v, f"{prefix}/{i}"))
    return out


def bits(t):
    t = t.detach().contiguous().cpu()
    return t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


def assert_bits_equal(want, got, what):
    assert want.keys() == got.keys(), f"{what}: names differ: {sorted(want.keys() ^ got.keys())[:5]}"
    for k in want:
        a, b = want[k], got[k]
        assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {k}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
        assert torch.equal(bits(a), bits(b)), f"{what}: {k}: values differ"


def case_save_restore(root, lazy):
    """Saves between real steps (deltas on) while the optimizer overwrites the
    tensors right after save_async returns (eager) or after staging (lazy);
    every step restores bit-identically into CUDA tensors and on the CPU."""
    t = Trainer(seed=1)
    t.train(2)  # AdamW's moments exist from here on
    expected = {}
    with ckpt.Checkpointer(root, delta="exact", full_every=3, lazy=lazy) as cp:
        for _ in range(6):
            t.forward_backward()
            t.optimizer_step()
            # What the checkpoint must hold: clones queued on the stream after
            # the step, before the save (no synchronize: the save must order
            # itself after the step's kernels, as the clones are).
            expected[t.step] = {k: v.clone() for k, v in gpu_tensors(t.state()).items()}
            resp = cp.save_async(t.step, t.state())
            if lazy:
                t.forward_backward()  # computes while staging runs
                resp.staging_completion.result(timeout=120)
                t.optimizer_step()  # overwrites what was saved
            else:
                t.optimizer_step()  # overwrites what was saved, right after save_async
        cp.wait()
    for step, want in expected.items():
        fresh = Trainer(seed=99)  # other values, same shapes, all on the GPU
        fresh.train(1)
        into = fresh.state()
        ckpt.load(root, step=step, into=into)
        got = gpu_tensors(into)
        assert all(v.is_cuda for k, v in got.items() if "model" in k), "destinations left the GPU"
        assert_bits_equal(want, got, f"step {step} into CUDA tensors")
        cpu_state = ckpt.load(root, step=step)
        assert_bits_equal(want, gpu_tensors(cpu_state), f"step {step} on the CPU")


def case_resume(root):
    """Training resumed from a checkpoint on the GPU continues bit-identically."""
    torch.use_deterministic_algorithms(True)
    full = Trainer(seed=3)
    full.train(4)
    with ckpt.Checkpointer(root, delta="exact") as cp:
        cp.save_async(full.step, full.state())
        after = full.train(4)  # runs while the save persists
        cp.wait()
    resumed = Trainer(seed=4)
    resumed.train(1)
    ckpt.load(root, into=resumed.state())
    resumed.step = 4
    again = resumed.train(4)
    assert after == again, f"losses after the resume differ: {after} vs {again}"
    assert_bits_equal(gpu_tensors(full.state()), gpu_tensors(resumed.state()), "state after resuming")


def main():
    case, root = sys.argv[1], sys.argv[2]
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        sys.exit(77)
    if case == "eager":
        case_save_restore(root, lazy=False)
    elif case == "lazy":
        case_save_restore(root, lazy=True)
    elif case == "resume":
        case_resume(root)
    else:
        sys.exit(f"unknown case {case}")
    print(f"{case}: ok ({os.environ.get('PYTORCH_CUDA_ALLOC_CONF', 'default allocator')})")


if __name__ == "__main__":
    main()
