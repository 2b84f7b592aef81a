"""pytest setup for the ckpt Python package, run against a build tree.

    python3 -m pytest -q tests/python

The package is imported from the source tree (torch_ext/python), even when an
installed copy exists; CKPT_TEST_INSTALLED=1 tests the installed one instead
(`cd / && CKPT_TEST_INSTALLED=1 python3 -m pytest -q REPO/tests/python`). The extension comes
from $CKPT_TORCH_EXT_LIB (ctest sets it to the built _ckpt_torch.so), else the
package looks in its own directory, then in <repo>/build*/torch_ext/.
`ckpt-restore` comes from $CKPT_RESTORE, else <repo>/build*/tools/, else PATH.
"""
import glob
import os
import shutil
import sys

import pytest

REPO = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))

if os.environ.get("CKPT_TEST_INSTALLED") != "1":
    sys.path.insert(0, os.path.join(REPO, "torch_ext", "python"))

os.environ.setdefault("CKPT_LOG", "warning")


@pytest.fixture
def root(tmp_path):
    """A fresh checkpoint root (on the same disk as the pytest temp dir)."""
    return str(tmp_path / "ckpts")


@pytest.fixture(scope="session")
def ckpt_restore():
    """Path of the ckpt-restore binary, or skip."""
    path = os.environ.get("CKPT_RESTORE")
    if not path:
        found = sorted(glob.glob(os.path.join(REPO, "build*", "tools", "ckpt-restore")),
                       key=os.path.getmtime, reverse=True)
        path = found[0] if found else shutil.which("ckpt-restore")
        if os.environ.get("CKPT_TEST_INSTALLED") == "1":
            path = shutil.which("ckpt-restore")
    if not path or not os.path.exists(path):
        pytest.skip("ckpt-restore not built")
    return path


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: long variants, skipped unless CKPT_SLOW_TESTS=1 (select with -m slow)")
