"""What ``train`` does with a run directory before anything is trained: nothing is removed or loaded unchecked."""

from __future__ import annotations

from pathlib import Path

import pytest

from composer_dynsample.cli import main

DIGITS = str(Path(__file__).resolve().parents[1] / "yamls" / "digits_quick.yaml")
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


def test_autoresume_from_a_folder_composer_cannot_name_is_one_line(tmp_path, capsys):
    """Composer reads '#' in a path as a URL fragment: it would look for another file than the run's."""
    run_dir = tmp_path / "run #1"
    previous_run(run_dir)
    (run_dir / "checkpoints" / "latest-rank0.pt").write_bytes(b"weights")
    code, err = run_main(
        ["train", DIGITS, *QUIET, "trainer.autoresume=true", "--run-dir", str(run_dir)], capsys
    )
    assert code == 2 and len(err) == 1, err
    assert "trainer.autoresume cannot resume from" in err[0] and "trainer.load_path=" in err[0]
