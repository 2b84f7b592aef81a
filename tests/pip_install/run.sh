#!/usr/bin/env bash
# `pip wheel .` then `pip install` of that wheel into a fresh venv (which sees
# the system's torch through --system-site-packages, so nothing large is
# downloaded; pip fetches scikit-build-core for the isolated build): the
# wheel builds against the environment's torch, `import ckpt` works from
# anywhere, ckpt-restore and ckpt-retain are on the venv's PATH, and a save
# and a load round-trip. Labelled slow (a full Release build: ~4 min here).
#   tests/pip_install/run.sh REPO
set -euo pipefail
repo=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
python=${CKPT_PYTHON:-$(python3 -c 'import sys; print(sys.executable)')}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A copy of the sources without build trees (the wheel's build dir is inside).
tar -C "$repo" --exclude='./build*' --exclude='./.git' -cf - . | (mkdir "$work/src" && tar -C "$work/src" -xf -)
"$python" -m venv --system-site-packages "$work/venv"
"$work/venv/bin/python" -m pip wheel --quiet --no-deps "$work/src" -w "$work/dist"
wheel=$(ls "$work"/dist/ckpt-*.whl)
echo "pip_install: built $(basename "$wheel")"
"$work/venv/bin/python" -m pip install --quiet --no-deps "$wheel"
test -x "$work/venv/bin/ckpt-restore" && test -x "$work/venv/bin/ckpt-retain"
"$work/venv/bin/ckpt-retain" --help >/dev/null
cd "$work"
"$work/venv/bin/python" - "$work/root" <<'PY'
import sys, torch, ckpt
root = sys.argv[1]
assert ckpt.__file__.startswith(sys.prefix), ckpt.__file__   # the venv's copy, not the tree's
state = {"w": torch.arange(1000, dtype=torch.float32), "step": 3}
with ckpt.Checkpointer(root, delta="exact") as cp:
    cp.save(1, state)
    state["w"] += 1
    cp.save(2, state)
got = ckpt.load(root)
assert torch.equal(got["w"], state["w"]) and got["step"] == 3
print("pip_install: ckpt", ckpt.__version__, "with torch", torch.__version__, "from", ckpt.__file__)
PY
"$work/venv/bin/ckpt-restore" --root "$work/root" --latest --verify >/dev/null
echo "pip_install: 1 passed, 0 failed"
