"""What ``train`` does with a run directory before anything is trained: nothing is removed or loaded unchecked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from composer.core import Callback, State
from composer.loggers import Logger

from composer_dynsample.cli.main import main

DIGITS = str(Path(__file__).resolve().parents[2] / "yamls" / "digits_quick.yaml")
QUIET = ["trainer.progress_bar=false"]

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def previous_run(run_dir: Path) -> dict[Path, bytes]:
    """A run directory's outputs, as a previous run leaves them (no training needed to check them)."""
    files = {
        run_dir / "metrics.json": b'{"recall_at_1": 0.9}',
        run_dir / "config.yaml": b"seed: 0\n",
        run_dir / "checkpoints" / "ep6-ba132-rank0.pt": b"weights",
    }
    for path, content in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return files


def run_main(argv: list[str], capsys) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return exit_info.value.code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optimizer.weight_decy=0.1", "optimizer: unknown key 'weight_decy'"),  # a section's key
        ("sampler.classes_per_batch=x", "sampler.classes_per_batch must be an integer"),  # a type
        ("trainer.max_duraton=1ep", "trainer: unknown key 'max_duraton'"),  # a Trainer key, from source
    ],
)
def test_overwrite_removes_nothing_when_the_config_is_wrong(tmp_path, capsys, override, message):
    run_dir = tmp_path / "run"
    files = previous_run(run_dir)
    code, err = run_main(
        ["train", DIGITS, *QUIET, override, "--run-dir", str(run_dir), "--overwrite"], capsys
    )
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert all(path.read_bytes() == content for path, content in files.items())


def test_autoresume_does_not_combine_with_overwrite(tmp_path, capsys):
    run_dir = tmp_path / "run"
    files = previous_run(run_dir)
    argv = ["train", DIGITS, *QUIET, "trainer.autoresume=true", "--run-dir", str(run_dir), "--overwrite"]
    code, err = run_main(argv, capsys)
    assert code == 2 and len(err) == 1, err
    assert "--overwrite would remove the checkpoints that trainer.autoresume=true resumes from" in err[0]
    assert all(path.read_bytes() == content for path, content in files.items())
    code, err = run_main(
        ["train", DIGITS, *QUIET, "trainer.autoresume=sometimes", "--run-dir", str(run_dir)], capsys
    )
    assert code == 2 and err == [
        "composer-dynsample train: error: trainer.autoresume must be true or false, got 'sometimes'."
    ]


def test_the_checkpoint_autoresume_would_load_is_checked_first(tmp_path, capsys):
    """Composer unpickles RUN_DIR/checkpoints/latest-rank0.pt itself: it is checked like a load_path."""
    import torch

    run_dir = tmp_path / "run"
    previous_run(run_dir)
    torch.save([1, 2, 3], run_dir / "checkpoints" / "latest-rank0.pt")
    argv = ["train", DIGITS, *QUIET, "trainer.autoresume=true", "--run-dir", str(run_dir)]
    code, err = run_main(argv, capsys)
    assert code == 2 and len(err) == 1, err
    assert (
        f"checkpoint '{run_dir / 'checkpoints' / 'latest-rank0.pt'}' is not a Composer checkpoint" in err[0]
    )


def test_autoresume_in_a_run_dir_composer_would_misread_checks_the_runs_own_checkpoint(tmp_path, capsys):
    """'#' in --run-dir: Composer is given the run directory through a path it reads as itself, so the
    checkpoint autoresume checks, and would load, is the run's own (here a broken one, named in one line)."""
    run_dir = tmp_path / "run #1"
    previous_run(run_dir)
    (run_dir / "checkpoints" / "latest-rank0.pt").write_bytes(b"weights")
    code, err = run_main(
        ["train", DIGITS, *QUIET, "trainer.autoresume=true", "--run-dir", str(run_dir)], capsys
    )
    assert code == 2 and len(err) == 1, err
    assert f"checkpoint '{run_dir / 'checkpoints' / 'latest-rank0.pt'}' is not a readable" in err[0]


def test_autoresume_from_a_save_folder_composer_cannot_name_is_one_line(tmp_path, capsys):
    """A trainer.save_folder of the user's is Composer's URI: '#' there would make it look for another file."""
    folder = tmp_path / "ck#1"
    folder.mkdir()
    (folder / "latest-rank0.pt").write_bytes(b"weights")
    argv = ["train", DIGITS, *QUIET, "trainer.autoresume=true", f"trainer.save_folder={folder}",
            "--run-dir", str(tmp_path / "run")]  # fmt: skip
    code, err = run_main(argv, capsys)
    assert code == 2 and len(err) == 1, err
    assert "trainer.autoresume cannot resume from" in err[0] and "trainer.load_path=" in err[0]


def test_the_refusal_names_the_checkpoint_that_resumes_the_previous_run(tmp_path, capsys):
    run_dir = tmp_path / "run"
    previous_run(run_dir)
    code, err = run_main(["train", DIGITS, *QUIET, "--run-dir", str(run_dir)], capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].endswith(
        f"or resume it with trainer.load_path={run_dir / 'checkpoints' / 'ep6-ba132-rank0.pt'}."
    ), err[0]


TRAIN_1EP = ["train", DIGITS, *QUIET, "trainer.max_duration=1ep", "evaluation.interval=null", "--quiet"]


@pytest.mark.parametrize("name", ["exp#1", "exp?a=1", "exp{rank}", "exp\tA", "exp\nB", " exp", "exp:1"])
def test_outputs_stay_inside_a_run_dir_composer_would_read_as_a_url(tmp_path, monkeypatch, name):
    """Composer formats '{rank}' in save_folder and parses it as a URL ('#' fragment, '?' query, 'a:b' a
    scheme, tabs dropped, leading spaces stripped): the run's checkpoints must still land in its directory."""
    monkeypatch.chdir(tmp_path)  # a relative --run-dir: 'exp:1' reads as the scheme 'exp'
    main([*TRAIN_1EP, "--run-dir", name])
    run_dir = tmp_path / name
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["checkpoint"] == str(Path(name) / "checkpoints" / "ep1-ba22-rank0.pt")
    assert sorted(path.name for path in (run_dir / "checkpoints").iterdir()) == [
        "ep1-ba22-rank0.pt",
        "latest-rank0.pt",
    ]
    assert [path.name for path in tmp_path.iterdir()] == [name]  # nothing written beside it


def test_two_runs_named_apart_by_a_hash_keep_their_own_checkpoints(tmp_path):
    """'X/exp#1' and 'X/exp#2' both wrote to 'X/exp/': the second overwrote the first's checkpoint."""
    for seed in (1, 2):
        main([*TRAIN_1EP, f"seed={seed}", "--run-dir", str(tmp_path / f"exp#{seed}")])
    weights = []
    for seed in (1, 2):
        metrics = json.loads((tmp_path / f"exp#{seed}" / "metrics.json").read_text())
        assert (
            metrics["seed"] == seed
            and Path(metrics["checkpoint"]).parent == tmp_path / f"exp#{seed}" / "checkpoints"
        )
        weights.append(torch.load(metrics["checkpoint"], weights_only=False)["state"]["model"])
    assert any(not torch.equal(weights[0][key], weights[1][key]) for key in weights[0])  # the seeds' own
    assert sorted(path.name for path in tmp_path.iterdir()) == ["exp#1", "exp#2"]


@pytest.mark.skipif(
    not Path("/sys/kernel").is_dir(), reason="needs Linux's /sys, where nobody may create a folder"
)
def test_a_run_dir_that_cannot_be_created_is_one_line(capsys):
    code, err = run_main([*TRAIN_1EP, "--run-dir", "/sys/kernel/composer-dynsample-run"], capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(
        "composer-dynsample train: error: --run-dir '/sys/kernel/composer-dynsample-run' cannot be written: "
    ), err[0]


class FailAt(Callback):
    """Raises at the end of one batch: a run that breaks part-way."""

    def __init__(self, batch: int) -> None:
        self.batch = batch

    def batch_end(self, state: State, logger: Logger) -> None:
        if int(state.timestamp.batch) == self.batch:
            raise RuntimeError(f"broken at batch {self.batch}")


def fail_at(batch: int) -> str:
    return f"callbacks.fail={{_component_: {__name__}.FailAt, batch: {batch}}}"


def test_a_run_that_fails_before_its_first_checkpoint_leaves_no_previous_run(tmp_path, capsys):
    """config.yaml and an empty checkpoints/ made the rerun refused as 'holds a previous run'."""
    run_dir = tmp_path / "run"
    with pytest.raises(RuntimeError, match="broken at batch 5"):
        main([*TRAIN_1EP, fail_at(5), "--run-dir", str(run_dir)])
    assert not run_dir.exists()
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine")
    with pytest.raises(RuntimeError, match="broken at batch 5"):
        main([*TRAIN_1EP, fail_at(5), "--run-dir", str(run_dir)])
    assert [path.name for path in run_dir.iterdir()] == ["notes.txt"]  # a folder of the user's stays
    main([*TRAIN_1EP, "--run-dir", str(run_dir)])
    assert json.loads((run_dir / "metrics.json").read_text())["epochs"] == 1


def test_a_run_that_fails_after_a_checkpoint_keeps_it_to_resume(tmp_path, capsys):
    run_dir = tmp_path / "run"
    with pytest.raises(RuntimeError, match="broken at batch 30"):
        main([*TRAIN_1EP[:-3], "trainer.max_duration=2ep", "trainer.save_interval=1ep", "evaluation.interval=null",
              "--quiet", fail_at(30), "--run-dir", str(run_dir)])  # fmt: skip
    assert sorted(path.name for path in (run_dir / "checkpoints").iterdir()) == [
        "ep1-ba22-rank0.pt",
        "latest-rank0.pt",
    ]
    code, err = run_main([*TRAIN_1EP, "--run-dir", str(run_dir)], capsys)
    assert code == 2 and err[0].endswith(
        f"resume it with trainer.load_path={run_dir / 'checkpoints' / 'latest-rank0.pt'}."
    ), err
