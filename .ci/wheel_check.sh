#!/usr/bin/env bash
# The plugin as a Composer user installs it: the wheel built from this checkout, installed with only its
# declared base dependencies (pinned by constraints.txt) into a fresh virtualenv, then
# docs/examples/own_composer_model.py run there on 1 process and under `composer -n 2`; the wheel declares
# torch, mosaicml, torchmetrics and numpy alone, and the command line without its extra says what to install.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
python="${PYTHON:-python3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$python" -m pip wheel --quiet --no-deps --wheel-dir "$work/dist" .
"$python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --upgrade "pip>=24"
"$work/venv/bin/python" -m pip install --quiet --constraint constraints.txt "$work"/dist/composer_dynsample-*.whl

"$work/venv/bin/python" - <<'PY'
import importlib.metadata as metadata
import re

requires = metadata.requires("composer-dynsample") or []
base = sorted(re.split(r"[<>=!~; ]", r, maxsplit=1)[0] for r in requires if "extra ==" not in r)
assert base == ["mosaicml", "numpy", "torch", "torchmetrics"], f"base Requires-Dist: {base}"
installed = sorted(d.metadata["Name"].lower() for d in metadata.distributions())
# What the cli extra adds that nothing in the base install brings (pillow and pyyaml come with Composer itself).
for application in ("omegaconf", "matplotlib", "mnist1d", "scikit-learn"):
    assert application not in installed, f"{application} came with the base install"
print(f"wheel check: base Requires-Dist {base}; {len(installed)} distributions installed")
PY

cd "$work"  # away from the checkout: the example imports the installed wheel
"$work/venv/bin/python" "$repo/docs/examples/own_composer_model.py"
port="$("$work/venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$work/venv/bin/composer" -n 2 --master_port "$port" "$repo/docs/examples/own_composer_model.py"

set +e
message="$("$work/venv/bin/composer-dynsample" train "$repo/yamls/mnist1d_default.yaml" 2>&1)"
status=$?
set -e
test "$status" -eq 2 || { echo "composer-dynsample without the cli extra exited $status: $message"; exit 1; }
test "$(printf '%s\n' "$message" | wc -l)" -eq 1 || { echo "more than one line: $message"; exit 1; }
case "$message" in *"pip install 'composer-dynsample[cli]'"*) ;; *) echo "no install advice: $message"; exit 1 ;; esac
du -sh "$work/venv" | sed 's/^/wheel check: the base install takes /'
echo "wheel check: passed"
