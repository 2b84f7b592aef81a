"""The ckpt engines behind StorageWriters: one per (root, options, group) in
this process, kept across saves.

DCP may hand each save a fresh copy of the writer (the process-based
async_save pickles it into its checkpoint process), so the engine cannot
live in the writer: a save of a copy finds the engine of the earlier saves
here, and deltas go on between them. A multi-rank engine is opened by every
rank in the same order (its store keys depend on it; see
_distributed.next_key_prefix), which holds since every rank runs the same
dcp.save calls. Engines still open at exit wait for their saves.
"""
import atexit
import threading

import torch

from .. import _distributed
from ..errors import translate

_lock = threading.Lock()
_engines = {}  # (root, options_json, id(group), size) -> (engine, group)


def engine_for(root, options_json, group, commit_timeout_s):
    """The engine for `root` with these options, opened on first use."""
    key = (root, options_json, id(group) if group is not None else None,
           group.size() if group is not None else 1)
    with _lock:
        held = _engines.get(key)
        if held is not None and held[1] is group:
            return held[0]
        with translate():
            if group is None:
                engine = torch.classes.ckpt.Engine(root, options_json)
            else:
                engine = torch.ops.ckpt.open_engine(root, options_json, group.boxed(),
                                                    _distributed.next_key_prefix(root),
                                                    commit_timeout_s)
        _engines[key] = (engine, group)
        return engine


def close_all():
    """Waits for every save in flight and closes every engine (tests, exit)."""
    with _lock:
        held = list(_engines.values())
        _engines.clear()
    first = None
    for engine, _ in held:
        try:
            with translate():
                engine.close(False)
        except Exception as e:  # noqa: BLE001 -- the first is raised below
            first = first or e
    if first is not None:
        raise first


@atexit.register
def _close_at_exit():
    try:
        close_all()
    except Exception:  # noqa: BLE001 -- exiting; the save's error was its caller's to see
        pass
