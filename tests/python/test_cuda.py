"""The torch path on a GPU: save_async from CUDA tensors between real GPT +
AdamW training steps (eager and lazy, exact deltas), the optimizer step
overwriting the tensors right after save_async returns, restores into CUDA
tensors bit-identical, training resumed bit-identically — with torch's
default caching allocator (whose segments can sit next to each other in
virtual memory: a copy must never span two) and with expandable segments.

Each case runs in its own process (cuda_workers.py) so the allocator's
configuration can differ. On a machine without a CUDA device every case is
skipped with that reason.
"""
import os
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="[optional] no CUDA device (torch.cuda.is_available() is False)")

ALLOCATORS = {"default": None, "expandable": "expandable_segments:True"}


@pytest.mark.parametrize("allocator", sorted(ALLOCATORS))
@pytest.mark.parametrize("case", ["eager", "lazy", "resume"])
def test_cuda_training_state(case, allocator, tmp_path):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if ALLOCATORS[allocator]:
        env["PYTORCH_CUDA_ALLOC_CONF"] = ALLOCATORS[allocator]
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # deterministic cuBLAS for the resume case
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.path.join(HERE, "..", "..", "torch_ext", "python"),
                                                    env.get("PYTHONPATH", "")] if p)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "cuda_workers.py"), case, str(tmp_path / "ckpts")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{case} ({allocator}): exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
