"""Loads the LibTorch extension that registers torch.ops.ckpt / torch.classes.ckpt.

Where the shared library is looked for, first match wins:
  1. $CKPT_TORCH_EXT_LIB (a path to _ckpt_torch.so; the tests use it),
  2. _ckpt_torch.so inside this package (where `cmake --install` puts it),
  3. a build tree of the source checkout this package sits in
     (<repo>/build*/torch_ext/_ckpt_torch.so, newest first).
"""
import glob
import os

import torch

LIBRARY_NAME = "_ckpt_torch.so"

_path = None


def _candidates():
    env = os.environ.get("CKPT_TORCH_EXT_LIB")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, LIBRARY_NAME)
    repo = os.path.normpath(os.path.join(here, "..", "..", ".."))  # torch_ext/python/ckpt -> repo
    builds = glob.glob(os.path.join(repo, "build*", "torch_ext", LIBRARY_NAME))
    yield from sorted(builds, key=os.path.getmtime, reverse=True)


def _registered():
    try:
        torch.ops.ckpt.save_async  # noqa: B018 -- raises until the library is loaded
        return True
    except (AttributeError, RuntimeError):
        return False


def load():
    """Loads the extension once; returns the path it was loaded from."""
    global _path
    if _path is not None:
        return _path
    if _registered():  # loaded by someone else (e.g. torch.ops.load_library)
        _path = "<already loaded>"
        return _path
    tried = []
    for path in _candidates():
        tried.append(path)
        if os.path.exists(path):
            torch.ops.load_library(path)
            _path = path
            return _path
    raise ImportError(
        "ckpt: cannot find the LibTorch extension " + LIBRARY_NAME + " (tried: " + ", ".join(tried)
        + "). Build it (cmake --build BUILD --target ckpt_torch) and install it "
        "(cmake --install BUILD), or set CKPT_TORCH_EXT_LIB to its path.")


def library_path():
    return load()
