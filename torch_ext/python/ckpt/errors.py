"""Exceptions of the ckpt package.

The extension raises c10 errors carrying the library's message, e.g.
"ckpt: save of step 7: RESOURCE_EXHAUSTED: write ... No space left on device".
`translate()` re-raises RuntimeErrors among them as CheckpointError (a
RuntimeError) or one of its subclasses, chosen by the status code in the
message; the message is kept word for word. ValueError and TypeError (invalid
arguments) pass through unchanged.
"""
import contextlib
import re


class CheckpointError(RuntimeError):
    """A save, load or verification failed; str() is the library's message."""

    code = None  # the library's status code, e.g. "DATA_LOSS"


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """No such checkpoint (or none that reads back intact)."""


class CorruptCheckpointError(CheckpointError):
    """A checksum or format check failed (DATA_LOSS)."""


class CheckpointStalledError(CheckpointError, TimeoutError):
    """A save made no progress for the engine's stall_timeout and was given up
    (DEADLINE_EXCEEDED); nothing of it was committed."""


_CODE = re.compile(r"\b([A-Z][A-Z_]+[A-Z]): ")
_BY_CODE = {"NOT_FOUND": CheckpointNotFoundError, "DATA_LOSS": CorruptCheckpointError,
            "DEADLINE_EXCEEDED": CheckpointStalledError}


def _first_line(message):
    return message.split("\nException raised from", 1)[0]


def wrap(error):
    """The CheckpointError for a RuntimeError raised by the extension."""
    if isinstance(error, CheckpointError) or not isinstance(error, RuntimeError) or \
            isinstance(error, (NotImplementedError,)):
        return error
    message = _first_line(str(error))
    m = _CODE.search(message)
    code = m.group(1) if m else None
    cls = _BY_CODE.get(code, CheckpointError)
    out = cls(message)
    out.code = code
    return out


@contextlib.contextmanager
def translate():
    """Re-raises RuntimeErrors of the extension as CheckpointError."""
    try:
        yield
    except RuntimeError as e:
        w = wrap(e)
        if w is e:
            raise
        raise w from None
