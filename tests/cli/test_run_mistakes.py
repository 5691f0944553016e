"""``export`` and ``eval --run RUN_DIR`` as a user who makes mistakes runs them: a run without a checkpoint
yet, a folder or a file that is not a run, a non-empty ``--out``, a ``latest`` link whose file is gone, a
truncated checkpoint and an export that fails while writing are each one line (exit status 2) that writes
nothing, and ``eval --run`` gives the figures of the train run's final evaluation."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")

from composer_dynsample.cli.main import main
from tests.cli.helpers import one_line_error, write_bag_pairs_config, write_pairs

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

PK = {"name": "pk", "classes_per_batch": 8, "samples_per_class": 2}  # 32 pairs: 4 batches an epoch
FIGURES = ("mrr", "mrr_at_10", "recall_at_1", "recall_at_5", "ndcg_at_10", "csn_mrr", "num_queries")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A bag-of-tokens pairs run of one epoch (checkpoints after batches 2 and 4), scored at its start and end."""
    folder = tmp_path_factory.mktemp("run_mistakes")
    write_pairs(folder, test=16)
    config = write_bag_pairs_config(folder, PK)
    main(["train", config, "evaluation.at_start=true", "trainer.save_interval=2ba", "--quiet",
          "--run-dir", str(folder / "run")])  # fmt: skip
    return folder / "run"


def copy_of(run_dir: Path, target: Path) -> Path:
    """A copy of the run directory, links kept as links."""
    shutil.copytree(run_dir, target, symlinks=True)
    return target


def test_eval_run_gives_the_train_run_s_final_figures(run_dir, tmp_path, capsys):
    run = copy_of(run_dir, tmp_path / "run")
    main(["eval", "--run", str(run)])
    evaluated = json.loads((run / "eval.json").read_text())
    trained = json.loads((run / "metrics.json").read_text())
    assert {key: evaluated[key] for key in FIGURES} == {key: trained[key] for key in FIGURES}
    # the start's figures differ: the equality above is of the trained weights, not of any model
    assert any(trained["at_start"][key] != trained[key] for key in FIGURES if key != "num_queries")


def test_a_run_without_a_checkpoint_yet_is_one_line(run_dir, tmp_path, capsys):
    """A run that has started (its config.yaml, lock and empty checkpoints/) and saved nothing yet."""
    run = tmp_path / "starting"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy(run_dir / "config.yaml", run / "config.yaml")
    (run / "train.lock").write_text("pid 1\n")
    error = one_line_error(capsys, ["export", "--run", str(run), "--out", str(tmp_path / "model")])
    assert error == (
        f"composer-dynsample export: error: --run '{run}' holds no checkpoint (checkpoints/*.pt): train or "
        "resume the run to save one."
    )
    error = one_line_error(capsys, ["eval", "--run", str(run)])
    assert error.endswith(f"or give '{run / 'config.yaml'}' without --run for the model as built."), error
    assert not (tmp_path / "model").exists() and sorted(path.name for path in run.iterdir()) == [
        "checkpoints",
        "config.yaml",
        "train.lock",
    ]


def test_a_folder_or_a_file_that_is_not_a_run_is_one_line(run_dir, tmp_path, capsys):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "todo.txt").write_text("train a model\n")
    error = one_line_error(capsys, ["export", "--run", str(folder), "--out", str(tmp_path / "model")])
    assert f"--run '{folder}' holds no config.yaml (train writes it there as it starts)" in error, error
    config = run_dir / "config.yaml"
    error = one_line_error(capsys, ["eval", "--run", str(config)])
    assert error == (
        f"composer-dynsample eval: error: --run '{config}': is a file, not a directory; give the run "
        "directory of a train run (its --run-dir)."
    )
    assert not (tmp_path / "model").exists() and [path.name for path in folder.iterdir()] == ["todo.txt"]


@pytest.mark.parametrize("kind", ["folder", "file"])
def test_an_out_that_holds_something_is_refused_and_kept(run_dir, tmp_path, capsys, kind):
    out = tmp_path / "model"
    if kind == "folder":
        out.mkdir()
        (out / "keep.txt").write_text("mine\n")
    else:
        out.write_text("mine\n")
    argv = ["export", "--run", str(run_dir), "--out", str(out), "--format", "huggingface"]
    error = one_line_error(capsys, argv)
    assert error.endswith(f"--out '{out}' exists and is not an empty directory; choose a new one."), error
    kept = out / "keep.txt" if kind == "folder" else out
    assert kept.read_text() == "mine\n" and sorted(path.name for path in tmp_path.iterdir()) == ["model"]


def test_a_latest_link_whose_file_is_gone_is_one_line_naming_what_is_left(run_dir, tmp_path, capsys):
    """Before, the newest other checkpoint was taken in its place without a word."""
    run = copy_of(run_dir, tmp_path / "run")
    link = run / "checkpoints" / "latest-rank0.pt"
    target = (run / "checkpoints" / link.readlink()).resolve()
    target.unlink()
    left = sorted(path.name for path in (run / "checkpoints").glob("*.pt") if path.is_file())
    assert left == ["ep0-ba2-rank0.pt"]
    error = one_line_error(capsys, ["export", "--run", str(run), "--out", str(tmp_path / "model")])
    assert error == (
        f"composer-dynsample export: error: --run '{run}': checkpoints/latest-rank0.pt links to "
        f"'{target.name}', which does not exist, so the run's latest checkpoint is gone; restore that file, or "
        f"give '{run / 'config.yaml'}' --checkpoint with one of the checkpoints left (ep0-ba2-rank0.pt)."
    )
    (run / "checkpoints" / "ep0-ba2-rank0.pt").unlink()
    error = one_line_error(capsys, ["eval", "--run", str(run)])
    assert error.endswith("restore that file, or train the run again (no other checkpoint is left)."), error
    assert not (tmp_path / "model").exists() and not (run / "eval.json").exists()


@pytest.mark.parametrize("keep", [0, 100, 0.5])
def test_a_truncated_checkpoint_is_one_line_naming_the_run_s_other_checkpoints(
    run_dir, tmp_path, capsys, keep
):
    run = copy_of(run_dir, tmp_path / "run")
    target = (run / "checkpoints" / "latest-rank0.pt").resolve()
    data = target.read_bytes()
    target.write_bytes(data[: int(len(data) * keep) if isinstance(keep, float) else keep])
    for command in (["eval", "--run", str(run)], ["export", "--run", str(run), "--out", str(tmp_path / "m")]):
        error = one_line_error(capsys, command)
        assert f"checkpoint '{run / 'checkpoints' / 'latest-rank0.pt'}'" in error, error
        assert "is empty (0 bytes)" in error if keep == 0 else "truncated or corrupt" in error, error
        assert error.endswith(
            f"(the latest checkpoint of --run '{run}'; give '{run / 'config.yaml'}' --checkpoint with another "
            "of its checkpoints (ep0-ba2-rank0.pt))"
        ), error
    assert not (tmp_path / "m").exists() and not (run / "eval.json").exists()


def test_an_export_that_fails_while_writing_leaves_nothing(run_dir, tmp_path, capsys, monkeypatch):
    """A full disk after the weights were written: before, a folder of some files and a traceback."""
    from composer_dynsample.export import huggingface

    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(huggingface, "_write_config", full_disk)
    out = tmp_path / "new" / "model"
    argv = ["export", "--run", str(run_dir), "--out", str(out), "--format", "huggingface"]
    error = one_line_error(capsys, argv)
    assert error == (
        f"composer-dynsample export: error: --out '{out}' could not be written (No space left on device); "
        "nothing was left there: free some space or choose another --out."
    )
    assert list(tmp_path.iterdir()) == []  # neither the folder, nor the one made for it, nor a staging one
    monkeypatch.undo()
    main(argv)  # the same command writes the whole folder once the disk has room
    assert sorted(path.name for path in out.iterdir()) == [
        "encoder_config.json",
        "encoder_state.pt",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert [path.name for path in out.parent.iterdir()] == ["model"]


def test_eval_never_replaces_the_record_train_wrote(tmp_path, capsys):
    write_pairs(tmp_path)
    config = write_bag_pairs_config(tmp_path, {"name": "pk", "classes_per_batch": 8, "samples_per_class": 2})
    run_dir = tmp_path / "run"
    main(["train", config, "--run-dir", str(run_dir), "trainer.max_duration=1ba", "--quiet"])
    before = (run_dir / "metrics.json").read_bytes()
    for name in ("metrics.json", "config.yaml"):
        error = one_line_error(capsys, ["eval", "--run", str(run_dir), "--out", str(run_dir / name)])
        assert f"is the {name} train wrote for this run; give another file" in error
    assert (run_dir / "metrics.json").read_bytes() == before
