"""docs/api.md's examples run as written: the own-ComposerModel script on 1 process and through Composer's
launcher on 2 (gloo, CPU), the block at the top of docs/api.md is that file, and the regression-test
example of Composer's batch-sampler epoch fix passes."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docs" / "examples" / "own_composer_model.py"
API = ROOT / "docs" / "api.md"
RESULT = re.compile(r"^1-NN accuracy on held-out points: (\d\.\d+) \(before training: (\d\.\d+)\)$", re.M)


def python_blocks(text: str) -> list[str]:
    """The bodies of the fenced ``python`` blocks of a Markdown text, in order."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_script(*launcher: str) -> tuple[float, float]:
    """Run the script (through ``launcher`` when given) from the repository root: ``(after, before)``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # two processes on a small CPU: one thread each
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)  # a launcher of this test's own must not leak into the script's processes
    result = subprocess.run(
        [sys.executable, *launcher, str(SCRIPT)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    found = RESULT.findall(result.stdout)
    assert len(found) == 1, output[-4000:]  # printed once: by rank 0 only
    after, before = (float(value) for value in found[0])
    return after, before


def test_the_top_of_api_md_is_the_script_verbatim():
    text = API.read_text()
    assert text.splitlines()[2] == "## Use the plugin from your own Composer script"
    assert python_blocks(text)[0] == SCRIPT.read_text()


@pytest.mark.timeout(300)
def test_the_script_trains_on_one_process_and_on_two():
    after, before = run_script()
    assert after >= 0.9 and after > before + 0.1, (after, before)
    launcher = ("-m", "composer.cli.launcher", "-n", "2", "--master_port", str(free_port()))
    after_two, before_two = run_script(*launcher)
    assert before_two == before  # the same model before training, on every rank
    assert after_two >= 0.9, after_two


@pytest.mark.timeout(300)
def test_the_regression_test_example_of_the_epoch_fix_passes():
    (example,) = [
        block for block in python_blocks(API.read_text()) if "reverted_batch_sampler_fix()" in block
    ]
    namespace: dict[str, object] = {"__name__": "api_md_epoch_fix"}
    exec(compile(example, "docs/api.md epoch-fix example", "exec"), namespace)
    tests = sorted(name for name in namespace if name.startswith("test_"))
    assert tests == [
        "test_set_sampler_epoch_gives_each_epoch_its_own_order",
        "test_without_set_sampler_epoch_every_epoch_repeats_epoch_0",
    ]
    for name in tests:
        namespace[name]()
