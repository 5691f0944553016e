"""Without the ``cli`` extra the command says in one line what to install; ``--help`` still answers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from composer_dynsample.cli.main import CLI_PACKAGES, missing_cli_packages

# A module set to None in sys.modules is one Python cannot import (and find_spec does not find).
WITHOUT = "import sys; sys.modules['omegaconf'] = sys.modules['matplotlib'] = None; "


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_the_installed_test_environment_has_the_whole_extra():
    assert missing_cli_packages() == []


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_command_without_the_extra_names_it_in_one_line(command, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("data: {name: mnist1d}\n")
    code = WITHOUT + f"from composer_dynsample.cli.main import main; main([{command!r}, {str(config)!r}])"
    result = run(code)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0] == (
        f"composer-dynsample {command}: error: the command line needs the 'cli' extra, which is not installed "
        "(no omegaconf, matplotlib): pip install 'composer-dynsample[cli]'"
    )


def test_help_answers_without_the_extra():
    result = run(WITHOUT + "from composer_dynsample.cli.main import main; main(['--help'])")
    assert result.returncode == 0, result.stderr
    assert "composer-dynsample train CONFIG.yaml" in result.stdout


def test_the_extra_named_in_pyproject_is_the_one_checked():
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    declared = {
        spec.split(">")[0].split("=")[0].split("<")[0].strip()
        for spec in project["optional-dependencies"]["cli"]
    }
    assert declared == set(CLI_PACKAGES.values())
    base = {spec.split(">")[0].split("<")[0].split("=")[0].strip() for spec in project["dependencies"]}
    assert base == {"torch", "mosaicml", "torchmetrics", "numpy"}
