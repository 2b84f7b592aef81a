"""Exceptions of the ckpt package.

The extension raises c10 errors carrying the library's message, e.g.
"ckpt: save of step 7: RESOURCE_EXHAUSTED: write ... No space left on device".
`translate()` re-raises RuntimeErrors among them as CheckpointError (a
RuntimeError) or one of its subclasses, chosen by the library's status code;
the message is kept word for word. ValueError and TypeError (invalid
arguments) pass through unchanged.

The code comes from the status itself, never from the message text (whose
context may hold anything: a root named "/data/RUN_A", a step directory
"DATA_LOSS: x"). Before the extension throws a library error it records the
status code and the message it throws in a thread-local slot; right after
catching, on the same thread, `translate()` takes that record with
torch.ops.ckpt.last_error() and uses its code when its message is the
caught exception's (a RuntimeError the library did not raise, e.g. a failed
copy_, records nothing: CheckpointError with code None).
"""
import contextlib

import torch


class CheckpointError(RuntimeError):
    """A save, load or verification failed; str() is the library's message."""

    code = None  # the library's status code, e.g. "DATA_LOSS"; None if not the library's


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """No such checkpoint (or none that reads back intact). NOT_FOUND."""

    code = "NOT_FOUND"


class CorruptCheckpointError(CheckpointError):
    """A checksum or format check failed (DATA_LOSS)."""

    code = "DATA_LOSS"


class CheckpointStalledError(CheckpointError, TimeoutError):
    """A save made no progress for the engine's stall_timeout and was given up,
    or (multi-rank) a rank did not report within commit_timeout_s
    (DEADLINE_EXCEEDED); nothing of it was committed."""

    code = "DEADLINE_EXCEEDED"


_BY_CODE = {"NOT_FOUND": CheckpointNotFoundError, "DATA_LOSS": CorruptCheckpointError,
            "DEADLINE_EXCEEDED": CheckpointStalledError}


def _first_line(message):
    return message.split("\nException raised from", 1)[0]


def error_for(code, message):
    """The CheckpointError (or subclass) for a status `code` ("NOT_FOUND", ...)."""
    out = _BY_CODE.get(code, CheckpointError)(message)
    out.code = code or None
    return out


def _take_last_error():
    """(code, message) the extension recorded for its last error on this thread."""
    try:
        code, message = torch.ops.ckpt.last_error()
    except (AttributeError, RuntimeError):  # an extension built before last_error existed
        return "", ""
    return code, message


def wrap(error, code=None):
    """The CheckpointError for a RuntimeError `error` raised by the extension,
    of the class for status `code` (None: a plain CheckpointError)."""
    if isinstance(error, CheckpointError) or not isinstance(error, RuntimeError) or \
            isinstance(error, (NotImplementedError,)):
        return error
    return error_for(code, _first_line(str(error)))


@contextlib.contextmanager
def translate():
    """Re-raises RuntimeErrors of the extension as CheckpointError."""
    try:
        yield
    except RuntimeError as e:
        if isinstance(e, (CheckpointError, NotImplementedError)):
            raise
        code, message = _take_last_error()
        if not message or message not in str(e):
            code = None  # not the error the library recorded: no code
        raise wrap(e, code) from None
