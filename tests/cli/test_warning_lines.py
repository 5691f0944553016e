"""The command line prints the package's own warnings as one line each, ``composer-dynsample: warning: ...``,
and other libraries' warnings as Python does; a recorded warning is untouched."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import composer_dynsample
from composer_dynsample.cli.main import one_line_warning

PACKAGE = Path(composer_dynsample.__file__).parent


def test_a_warning_of_the_package_is_one_line_and_another_is_python_s():
    ours = one_line_warning(
        "texts were truncated.", UserWarning, str(PACKAGE / "data" / "text" / "pairs.py"), 7
    )
    assert ours == "composer-dynsample: warning: texts were truncated.\n"
    theirs = one_line_warning("deprecated.", FutureWarning, "/site-packages/other/module.py", 3, "x = 1")
    assert theirs == warnings.formatwarning(
        "deprecated.", FutureWarning, "/site-packages/other/module.py", 3, "x = 1"
    )
    assert "FutureWarning" in theirs and "x = 1" in theirs


def test_the_command_line_prints_a_package_warning_as_one_line(tmp_path):
    """Through the real entry point (its command replaced by one that warns twice), the package's warning is
    one line without a file name or source line, the other library's is Python's, and the format is put
    back afterwards."""
    script = (
        "import warnings, sys\n"
        "from composer_dynsample.cli import main as cli\n"
        "from composer_dynsample.cli.main import one_line_warning\n"
        "assert warnings.formatwarning is not one_line_warning\n"
        "previous = warnings.formatwarning\n"
        "def command(*args):\n"
        f"    warnings.warn_explicit('a note', UserWarning, {str(PACKAGE / 'x.py')!r}, 1)\n"
        "    warnings.warn_explicit('theirs', UserWarning, '/elsewhere/y.py', 2)\n"
        "cli._run_command = command\n"
        "cli.main(['eval', 'c.yaml'])\n"
        "assert warnings.formatwarning is previous\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert "composer-dynsample: warning: a note" in lines
    assert any(line.startswith("/elsewhere/y.py:2: UserWarning: theirs") for line in lines)
