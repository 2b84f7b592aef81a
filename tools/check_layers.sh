#!/usr/bin/env bash
# The layer check: the lowest layers of libckpt include nothing above them.
#
#   util    utilities with no notion of files or checkpoints
#   io      the file-system seam and its queues (may use util)
#   codec   record codecs: bytes in, bytes out (codec/ and delta/; may use util)
#   format  on-disk names, manifests, shard plans (may use util, io, codec)
#
# and the Python package (torch_ext/python/ckpt) has no import cycle.
#
# Everything else (read/, engine/, commit/, distributed/, ...) sits above and
# may use all of these. Public headers (ckpt/*.h) that declare types are
# allowed everywhere; those that declare operations (maintenance, catalog,
# compact, ...) are above every layer checked here.
#
# Usage: tools/check_layers.sh [SRC_DIR]    (default: libckpt/src beside this script)
#        tools/check_layers.sh --self-test  (plants an upward include in a copy of
#                                            each checked layer; must be refused)
# Third-party headers (absl/, <...>) are allowed everywhere.
# Exits 0 when every include is allowed, 1 listing each one that is not.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
src=${1:-"$here/../libckpt/src"}

# Public headers that declare types and interfaces, not operations.
type_headers='ckpt/(dtype|tensor|kinds|log|file_system|options|distributed|json|reader|engine)\.h'

allowed_for() {
  case "$1" in
    util) echo "^(absl/|util/|$type_headers)" ;;
    io) echo "^(absl/|util/|io/|$type_headers)" ;;
    format) echo "^(absl/|util/|io/|codec/|format/|$type_headers)" ;;
  esac
}

check() {
  local src=$1 bad=0 layer file include allowed
  for layer in util io format; do
    [[ -d $src/$layer ]] || continue
    allowed=$(allowed_for "$layer")
    while read -r file include; do
      if ! [[ $include =~ $allowed ]]; then
        echo "layer check: ${file#"$src"/} ($layer) includes \"$include\", a layer above it" >&2
        bad=1
      fi
    done < <(grep -EH '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$src/$layer"/*.h "$src/$layer"/*.cc \
               2>/dev/null | sed -E 's/^([^:]*):[^"]*"([^"]+)".*/\1 \2/')
  done
  return $bad
}

# The Python package's modules import one another without a cycle (each
# import, at the top or inside a function, counts).
check_python() {
  python3 - "$1" <<'PY'
import glob, os, re, sys
graph = {}
for path in glob.glob(os.path.join(sys.argv[1], "*.py")):
    deps = set()
    for mod, names in re.findall(r"^\s*from \.(\w*) import ([\w, ]+)", open(path).read(), re.M):
        deps.update([mod] if mod else (n.strip() for n in names.split(",")))
    graph[os.path.basename(path)[:-3]] = deps
state = {}
def visit(m, trail):
    if state.get(m) == "done" or m not in graph:
        return
    if state.get(m) == "open":
        cycle = trail[trail.index(m):] + [m]
        sys.exit("layer check: Python import cycle: " + " -> ".join(cycle))
    state[m] = "open"
    for d in sorted(graph[m]):
        visit(d, trail + [m])
    state[m] = "done"
for m in sorted(graph):
    visit(m, [])
PY
}

if [[ ${1:-} == --self-test ]]; then
  src="$here/../libckpt/src"
  check "$src" && check_python "$here/../torch_ext/python/ckpt" ||
    { echo "layer check self-test: the tree itself fails" >&2; exit 1; }
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  for plant in 'util/ io/small_file.h' 'io/ format/names.h' 'io/ ckpt/maintenance.h' \
               'format/ distributed/rank_layout.h' 'format/ delta/delta_codec.h'; do
    read -r layer include <<<"$plant"
    rm -rf "$tmp/src" && cp -r "$src" "$tmp/src"
    victim=$(ls "$tmp/src/$layer"*.cc | head -n 1)
    printf '#include "%s"\n' "$include" >>"$victim"
    if check "$tmp/src" 2>/dev/null; then
      echo "layer check self-test: an include of $include planted in $layer was not refused" >&2
      exit 1
    fi
  done
  rm -rf "$tmp/py" && cp -r "$here/../torch_ext/python/ckpt" "$tmp/py"
  printf '\ndef _planted():\n    from . import loading\n' >>"$tmp/py/_dist_load.py"
  if check_python "$tmp/py" 2>/dev/null; then
    echo "layer check self-test: a planted Python import cycle was not refused" >&2
    exit 1
  fi
  echo "layer check self-test: every planted upward include and import cycle was refused"
  exit 0
fi

status=0
check "$src" || status=1
py=${CKPT_PYTHON_PACKAGE:-"$here/../torch_ext/python/ckpt"}
if [[ -z ${1:-} && -d $py ]]; then check_python "$py" || status=1; fi
exit $status
