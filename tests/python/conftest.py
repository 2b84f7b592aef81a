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


@pytest.fixture
def dcp_engines_closed():
    """Closes the engines ckpt.dcp's writers keep open across saves, after the test."""
    yield
    import ckpt.dcp
    ckpt.dcp.close_all()


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


# Under `tools/test.sh --full` (CKPT_TEST_REQUIRE_ALL=1) a skip for want of
# something the machine should have (torch.distributed with gloo, numpy,
# safetensors, ckpt-restore, ckpt-retain) is a failure that names it. Skips
# whose reason starts with OPTIONAL (no CUDA device, an older Python) stay
# skips: CI machines need not have them. Every skip is counted and listed
# either way (tools/test_summary.py).
OPTIONAL = "[optional] "
REQUIRE_ALL = os.environ.get("CKPT_TEST_REQUIRE_ALL") == "1"


def _required_skip(report):
    if not (REQUIRE_ALL and report.skipped):
        return None
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    reason = reason.removeprefix("Skipped: ")
    return None if reason.startswith(OPTIONAL) else reason


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    reason = _required_skip(report)
    if reason is not None:
        report.outcome = "failed"
        report.longrepr = f"tools/test.sh --full requires what this skip lacks: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    reason = _required_skip(report)
    if reason is not None:
        report.outcome = "failed"
        report.longrepr = f"tools/test.sh --full requires what this skip lacks: {reason}"
