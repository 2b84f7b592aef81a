"""Checking Checkpointer options before anything is opened or serialized."""
import math
import numbers
import os

import torch

_option_names = None


def _known_options():
    """Engine option names the extension knows, or None if it cannot say."""
    global _option_names
    if _option_names is None:
        try:
            _option_names = frozenset(torch.ops.ckpt.engine_option_names())
        except (AttributeError, RuntimeError):  # an extension built before the op existed
            _option_names = frozenset()
    return _option_names or None


def _check_options(options):
    """`options` (the **options of Checkpointer) checked before they are
    serialized: ValueError naming an unknown option, or one whose value is not
    None, bool, int, a finite float, str or os.PathLike (made str)."""
    known = _known_options()
    out = {}
    for name, value in options.items():
        if known is not None and name not in known:
            raise ValueError(f'ckpt: unknown engine option "{name}" (known: {", ".join(sorted(known))})')
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not (value is None or type(value) in (bool, int, str)
                or (type(value) is float and math.isfinite(value))):
            raise ValueError(f'ckpt: engine option "{name}" is {value!r} (a {type(value).__name__}); '
                             "expected None, a bool, an int, a finite float or a str")
        out[name] = value
    return out


def _number(name, value, kind):
    """`value` as `kind` (int or float), or ValueError naming the parameter:
    bools, strings and other objects are refused rather than converted."""
    ok = isinstance(value, numbers.Integral) if kind is int else isinstance(value, numbers.Real)
    if isinstance(value, bool) or not ok or (kind is float and not math.isfinite(value)):
        raise ValueError(f"ckpt: {name} must be {'an int' if kind is int else 'a finite number'}, "
                         f"got {value!r} (a {type(value).__name__})")
    return kind(value)


def _flag(name, value):
    if not isinstance(value, (bool, int)) or value not in (0, 1):
        raise ValueError(f"ckpt: {name} must be True or False, got {value!r}")
    return bool(value)
