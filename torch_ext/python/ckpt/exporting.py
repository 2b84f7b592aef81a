"""ckpt.export and ckpt.export_hf: a checkpoint as one safetensors file, or as a
Hugging Face model directory, through ckpt-restore."""
import glob
import os
import shutil
import subprocess
import sys

from . import _tree
from .errors import error_for

# ckpt-restore's documented exit codes (docs/ckpt-restore.md) -> status codes.
_EXIT_CODES = {1: "DATA_LOSS", 2: "INVALID_ARGUMENT", 3: "NOT_FOUND", 4: "UNKNOWN"}


def _ckpt_restore():
    """The ckpt-restore program: $CKPT_RESTORE, next to this interpreter (a pip
    install puts it there), on PATH, or in a build tree of this checkout."""
    env = os.environ.get("CKPT_RESTORE")
    if env:
        return env
    beside = os.path.join(os.path.dirname(sys.executable), "ckpt-restore")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("ckpt-restore")
    if found:
        return found
    repo = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
    builds = sorted(glob.glob(os.path.join(repo, "build*", "tools", "ckpt-restore")),
                    key=os.path.getmtime, reverse=True)
    if builds:
        return builds[0]
    raise FileNotFoundError("ckpt: ckpt-restore not found (set CKPT_RESTORE, or put it on PATH)")


def export(root, path, step=None, filter=None, rank=None):  # noqa: A002 -- the CLI's name
    """Writes checkpoint `step` of `root` (None: the newest that verifies) as the
    safetensors file `path`: deltas resolved, every checksum verified, tensors
    named as saved ("model.0.weight", ...), the saved non-tensor values in the
    file's metadata. `filter`: keep only tensors whose names start with it.
    `rank`: only rank r's part of a multi-rank checkpoint (its own tensors and
    the replicated ones, under the names it saved); None: all of it (tensors
    other than replicated ones named "rank<r>/<name>").
    Never overwrites `path` (FileExistsError). Raises CheckpointError (or
    CheckpointNotFoundError / CorruptCheckpointError) when the export fails.
    Returns `path`.
    """
    options = [] if filter is None else ["--filter", str(filter)]
    return _run_export("export", "--out", root, path, step, rank, options)


def export_hf(root, out_dir, step=None, strip_prefix=None, filter=None, max_shard_size=None,  # noqa: A002
              dtype=None, copy=(), rank=None):
    """Writes checkpoint `step` of `root` (None: the newest that verifies) as
    the Hugging Face model directory `out_dir`, what `from_pretrained` and the
    `safetensors` library read (`ckpt-restore --export-hf`): deltas resolved,
    every checksum verified; one `model.safetensors`, or several
    `model-0000K-of-0000N.safetensors` and `model.safetensors.index.json`.

    strip_prefix: export only the tensors whose names start with it, named
        without it ("model." for a state saved as {"model": model}).
    filter: export only the tensors whose names start with it (as saved).
    max_shard_size: the most tensor bytes per file, as transformers'
        `max_shard_size` (an int, or "5GB", "500MiB", ...; default "50GB").
    dtype: floating tensors written as this dtype (torch.bfloat16 or
        "bfloat16", float16, float32, float64), rounded as Tensor.to rounds.
    copy: files copied beside them under their base names (config.json,
        tokenizer files).
    Tied weights are written once (a tie is one tensor in the checkpoint);
    from_pretrained ties the other name to it. Never overwrites `out_dir`
    (FileExistsError). Returns `out_dir`.
    """
    args = []
    if strip_prefix:
        args += ["--strip-prefix", str(strip_prefix)]
    if filter:
        args += ["--filter", str(filter)]
    if max_shard_size is not None:
        args += ["--max-shard-size", str(max_shard_size)]
    if dtype is not None:
        args += ["--dtype", str(dtype).replace("torch.", "")]
    copy = [os.fspath(c) for c in ([copy] if isinstance(copy, (str, os.PathLike)) else copy)]
    if any("," in c for c in copy):
        raise ValueError(f"ckpt: export_hf cannot copy a file whose path holds a comma: {copy}")
    if copy:
        args += ["--copy", ",".join(copy)]
    return _run_export("export_hf", "--export-hf", root, out_dir, step, rank, args)


def _run_export(what, flag, root, out, step, rank, options):
    """Runs `ckpt-restore --root root <flag> out` for checkpoint `step` (None:
    --latest) with `options`; returns `out`. Refuses an `out` that exists."""
    out = os.fspath(out)
    if os.path.lexists(out):
        raise FileExistsError(f"ckpt: {out} exists; export never overwrites")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        raise ValueError(f"ckpt: rank must be None or a rank >= 0, got {rank!r}")
    args = [_ckpt_restore(), "--root", os.fspath(root), flag, out, "--progress=never"]
    args += ["--latest"] if step is None else ["--step", str(_tree.as_step(step))]
    args += options
    if rank is not None:
        args += ["--rank", str(rank)]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip()
        raise error_for(_EXIT_CODES.get(done.returncode, "UNKNOWN"), f"ckpt: {what}: {message}")
    return out
