"""The README's main job (torch_ext/examples/train_resume.py), shortened: train
with checkpoints, SIGKILL mid-run, recover with ckpt-restore + ckpt.load,
resume, and compare with the uninterrupted run; then SIGTERM a preemptible
run, which takes a final save and exits, and resume from that."""
import os
import re
import subprocess
import sys

import ckpt

REPO = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(REPO, "torch_ext", "examples", "train_resume.py")


def test_train_kill_recover_resume(tmp_path, ckpt_restore):
    env = dict(os.environ)
    package_parent = os.path.dirname(os.path.dirname(ckpt.__file__))
    env["PYTHONPATH"] = package_parent + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("CKPT_TORCH_EXT_LIB", ckpt.library_path())
    out = subprocess.run(
        [sys.executable, SCRIPT, "--work", str(tmp_path), "--steps", "12", "--every", "3",
         "--kill-at", "8", "--term-at", "5", "--ckpt-restore", ckpt_restore],
        capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SIGKILL at step 8" in out.stdout
    # The save of step 6 may still have been in flight when the child died.
    recovered = re.search(r"newest checkpoint that verifies: step (\d+)", out.stdout)
    assert recovered and recovered.group(1) in ("3", "6"), out.stdout
    assert f"OK: resumed from step {recovered.group(1)} after SIGKILL" in out.stdout, out.stdout
    assert "bit-identical" in out.stdout
    # SIGTERM at step 5: the final save is of step 5 or 6 (the next boundary).
    final = re.search(r"final save of step (\d+) .* the worker exited by itself; newest checkpoint: "
                      r"step (\d+)", out.stdout)
    assert final and final.group(1) == final.group(2) and final.group(1) in ("5", "6"), out.stdout
    assert "after SIGTERM" in out.stdout
