"""The command line answers at once: help, version and config errors import neither torch nor Composer."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from composer_dynsample.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import sys
from composer_dynsample.cli import main
try:
    main({argv!r})
except SystemExit as exit:
    print("exit", exit.code, file=sys.stderr)
print("heavy:", sorted(name for name in ("torch", "composer") if name in sys.modules), file=sys.stderr)
"""


def probe(*argv: str) -> subprocess.CompletedProcess:
    code = PROBE.format(argv=list(argv))
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "argv",
    [
        ("--help",),
        ("train", "--help"),
        ("eval", "--help"),
        ("--version",),
        ("train", "yamls/digits_quick.yaml", "sede=1"),
        ("train", "missing.yaml"),
    ],
)
def test_help_version_and_config_errors_import_nothing_heavy(argv):
    result = probe(*argv)
    assert "heavy: []" in result.stderr, result.stderr[-3000:]


def test_a_config_error_is_one_line_naming_the_key_and_the_closest():
    result = probe("train", "yamls/digits_quick.yaml", "sede=1")
    lines = [line for line in result.stderr.splitlines() if line.startswith("composer-dynsample")]
    assert lines == [
        "composer-dynsample train: error: the config: unknown key 'sede' for the top level; valid keys: "
        "['algorithms', 'callbacks', 'data', 'dataloader', 'evaluation', 'loggers', 'model', 'optimizer', "
        "'run_dir', 'sampler', 'scheduler', 'seed', 'trainer']. Did you mean 'seed'?"
    ]
    assert "exit 2" in result.stderr


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert re.fullmatch(r"composer-dynsample \d+\.\d+\S*\n", capsys.readouterr().out)


@pytest.mark.parametrize("command", [None, "train", "eval", "embed"])
def test_help_is_plain_text(command):
    parser = build_parser()
    if command is not None:
        parser = parser._subparsers._group_actions[0].choices[command]  # the subcommand's parser
    text = parser.format_help()
    assert not re.search(r"``|:(mod|func|class|meth):`", text), text


def test_demo_is_gone_in_favour_of_the_digits_recipe(capsys):
    with pytest.raises(SystemExit):
        main(["demo"])
    assert "invalid choice: 'demo'" in capsys.readouterr().err
