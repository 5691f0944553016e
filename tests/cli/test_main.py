"""The command line answers at once: help, version and config errors import neither torch nor Composer."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from composer_dynsample.cli.main import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import sys
from composer_dynsample.cli.main import main
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
        ("train", "yamls/digits_quick.yaml", "seed=x"),
        ("train", "yamls/digits_quick.yaml", "optimizer=[1]"),
        ("train", "missing.yaml"),
        ("eval", "yamls/digits_quick.yaml", "--checkpoint", "missing.pt"),
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
        "'resume_on_changed_data', 'run_dir', 'sampler', 'scheduler', 'seed', 'trainer']. Did you mean 'seed'?"
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


@pytest.mark.parametrize(
    ("cores", "local_ranks", "omp", "expected"),
    [
        (2, None, None, 1),  # a small machine: one thread (2 threads trained the digits recipe 2-18x slower)
        (3, None, None, 1),
        (4, None, None, 4),
        (16, "2", None, 8),  # Composer's launcher: the cores shared among the local ranks
        (16, "8", None, 1),
        (16, None, "3", None),  # the user's OMP_NUM_THREADS decides; nothing is set
    ],
)
def test_the_thread_policy(monkeypatch, cores, local_ranks, omp, expected):
    import torch

    from composer_dynsample.cli.commands import set_cpu_threads

    before = torch.get_num_threads()
    monkeypatch.setattr("os.cpu_count", lambda: cores)
    for name, value in (("LOCAL_WORLD_SIZE", local_ranks), ("OMP_NUM_THREADS", omp)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    try:
        assert set_cpu_threads() == expected
        assert torch.get_num_threads() == (expected or before)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optimizer.lrr=1", "optimizer: unknown key 'lrr'"),
        ("model.encoder.hidden=[8]", "model.encoder: unknown key 'hidden'"),
        ("model.loss.name=nope", "model.loss.name: unknown name 'nope'"),
        ("sampler.classes_per_batch=x", "sampler.classes_per_batch must be an integer"),
        ("dataloader.num_workerz=1", "dataloader: unknown key 'num_workerz'"),
        ("data.test_fractionn=0.1", "data: unknown key 'test_fractionn'"),
        ("evaluation.ks=[0]", "evaluation.ks must be a list of distinct integers"),
        ("trainer.max_duration=abc", "trainer.max_duration must be a Composer time string"),
        # Composer-backed targets: their signatures are read from source, not imported.
        ("trainer.max_duraton=1ep", "trainer: unknown key 'max_duraton' for composer.Trainer"),
        ("model.forward_chunk_sise=8", "model: unknown key 'forward_chunk_sise' for EmbeddingModel"),
        (
            "algorithms.hard_negative_mining.strategyy=x",
            "algorithms.hard_negative_mining: unknown key 'strategyy'",
        ),
        ("algorithms.hard_negativ_mining={}", "algorithms.hard_negativ_mining: unknown name"),
        ("callbacks.speed_monitor={window_sise: 3}", "callbacks.speed_monitor: unknown key 'window_sise'"),
        ("loggers.file={bogus: 1}", "loggers.file: unknown key 'bogus'"),
        (
            "scheduler.pct_strat=0.3",
            "scheduler: unknown key 'pct_strat' for 'one_cycle'",
        ),
        ("seed=99999999999", "seed must be an integer in [0, 4294967295], got 99999999999"),
        ("trainer.max_duration=0ep", "trainer.max_duration must be greater than zero, got '0ep'"),
        ("evaluation.interval=0ep", "evaluation.interval must be greater than zero, got '0ep'"),
    ],
)
def test_section_errors_answer_before_composer_is_imported_or_data_loaded(override, message):
    """The cheap checks run first: these errors need at most torch (for a target's signature)."""
    code = PROBE.format(
        argv=["train", "yamls/digits_quick.yaml", override, "--run-dir", "/nonexistent/never"]
    )
    code = code.replace('("torch", "composer")', '("composer", "sklearn")')  # digits loads with scikit-learn
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert message in result.stderr and "exit 2" in result.stderr, result.stderr[-3000:]
    assert "heavy: []" in result.stderr, result.stderr[-3000:]


def test_ranks_that_built_different_samplers_end_in_one_line(monkeypatch, capsys):
    """SetSamplerEpoch raises RankMismatchError on every rank mid-fit; the command prints it as one line."""
    from composer_dynsample.cli import commands
    from composer_dynsample.distributed import RankMismatchError

    def disagree(*args, **kwargs):
        raise RankMismatchError("SetSamplerEpoch, epoch 0: ranks [1] disagree with rank 0 on the labels")

    monkeypatch.setattr(commands, "train", disagree)
    with pytest.raises(SystemExit) as exit:
        main(["train", "yamls/digits_quick.yaml"])
    assert exit.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "composer-dynsample train: error: SetSamplerEpoch, epoch 0: ranks [1] disagree with rank 0 on the labels"
    ]
