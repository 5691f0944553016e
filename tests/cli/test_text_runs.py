"""Text-pair runs through the real command line: batches the pairs cannot fill, samplers without their
embedding table and resumes on a data file replaced since the checkpoint, each refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("tokenizers")

from composer_dynsample.cli.main import main
from composer_dynsample.config.components import ConfigError
from composer_dynsample.config.sampler_table import check_sampler_table
from composer_dynsample.data import DatasetSplits, TensorStore
from composer_dynsample.data.identity import data_changes, data_identity
from tests.cli.helpers import MINED, latest_checkpoint, one_line_error, write_bag_pairs_config, write_pairs
from tests.data.text.helpers import pair_rows, write_jsonl

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

DIGITS = str(Path(__file__).resolve().parents[2] / "yamls" / "digits_quick.yaml")
PK = {"name": "pk", "classes_per_batch": 8, "samples_per_class": 2}


def refusal(argv: list[str], capsys) -> str:
    """The one line of stderr of a command that exits with status 2."""
    error = one_line_error(capsys, argv)
    assert error.startswith("composer-dynsample train: error: "), error
    return error


# ----------------------------------------------------------------------------- batches of pairs (P x K)
def test_more_than_two_samples_per_class_on_pairs_says_a_pair_is_two_rows(tmp_path, capsys):
    write_pairs(tmp_path, train=64)
    config = write_bag_pairs_config(tmp_path, {**PK, "samples_per_class": 4})
    line = refusal(["train", config, "--run-dir", str(tmp_path / "run")], capsys)
    assert "sampler.samples_per_class=4: pairs data have exactly 2 rows per class" in line, line
    assert "a query and its passage" in line and "samples_per_class must be 2" in line, line
    assert "[2, 2]" not in line and "mined_negatives" in line, line
    assert not (tmp_path / "run").exists()


def test_a_batch_of_more_pairs_than_the_file_is_named_before_the_evaluation(tmp_path, capsys):
    """Two pairs, the test split cut from them: the batch of 16 pairs is the problem, not evaluation.ks."""
    write_pairs(tmp_path, train=2)
    config = write_bag_pairs_config(tmp_path, {**PK, "classes_per_batch": 16}, test_path=None)
    argv = ["train", config, "evaluation.interval=1ep", "--run-dir", str(tmp_path / "run")]
    line = refusal(argv, capsys)
    assert "sampler.classes_per_batch=16: a batch of 16 pairs needs 16 training pairs" in line, line
    assert "the training split holds 1 (the test split took 1 of the file's pairs)" in line, line
    assert "evaluation.ks" not in line and not (tmp_path / "run").exists()


def test_a_batch_of_more_pairs_than_the_training_file_says_which_sizes_fit(tmp_path, capsys):
    write_pairs(tmp_path, train=3)
    config = write_bag_pairs_config(
        tmp_path, {**MINED, "pairs_per_batch": 16}, algorithms={"embedding_table": {}}
    )
    line = refusal(["train", config, "--run-dir", str(tmp_path / "run")], capsys)
    assert (
        "sampler.pairs_per_batch=16: a batch of 16 pairs needs 16 training pairs, but the training " in line
    )
    assert "split holds 3; use sampler.pairs_per_batch in [2, 3] or add training pairs." in line, line


def test_the_batch_is_checked_before_the_evaluation_for_any_data(tmp_path, capsys):
    """Digits hold 10 classes: a batch of 11 is said first, though evaluation.ks is wrong too."""
    argv = ["train", DIGITS, "sampler.classes_per_batch=11", "evaluation.ks=[5000]"]
    line = refusal([*argv, "--run-dir", str(tmp_path / "run")], capsys)
    assert "classes_per_batch=11 x samples_per_class=8 cannot be satisfied" in line, line
    assert "evaluation.ks" not in line and not (tmp_path / "run").exists()


# ------------------------------------------------------------------------- model-aware samplers, no table
@pytest.mark.parametrize(
    ("sampler", "without"),
    [
        (MINED, "every negative would be a random passage"),
        ({**PK, "name": "hard_class_pk"}, "every batch would hold random classes"),
        ({"name": "neighbours", "seeds_per_batch": 4, "negatives_per_seed": 2}, "random sample of another"),
    ],
)
def test_a_model_aware_sampler_without_the_embedding_table_is_refused(tmp_path, capsys, sampler, without):
    write_pairs(tmp_path)
    config = write_bag_pairs_config(tmp_path, sampler, algorithms={"embedding_table": None})
    line = refusal(["train", config, "--run-dir", str(tmp_path / "run")], capsys)
    assert f"sampler: {sampler['name']!r} takes its batches from the embedding table" in line, line
    assert without in line and "Add algorithms: {embedding_table: {warm_start: true}}" in line, line
    assert "'algorithms.embedding_table={warm_start: true}'" in line, line
    chosen = "classes" if sampler["name"] == "hard_class_pk" else "negatives"
    assert (
        f"{chosen} mined from the first step (without warm_start the first epoch's {chosen} are random)"
        in line
    )
    assert "'algorithms.embedding_table={}'" not in line and "feed_sampler: false" in line, line
    assert not (tmp_path / "run").exists()


def test_the_override_the_refusal_names_adds_a_warm_table(tmp_path):
    write_pairs(tmp_path)
    config = write_bag_pairs_config(tmp_path, MINED)
    override = "algorithms.embedding_table={warm_start: true}"
    main(["train", config, override, "--quiet", "--run-dir", str(tmp_path / "run")])
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert len(metrics["embedding_table"]) == 1  # the table ran, one epoch
    assert (
        metrics["embedding_table_warm_start"]["rows_encoded"] == 64
    )  # 32 pairs encoded before the first step
    assert len(metrics["embedding_table"][0]["sampler"]["snapshots"]) == 1  # mined from the first epoch


def test_a_previous_run_survives_a_refused_sampler_with_overwrite(tmp_path, capsys):
    """The refusal comes with the config's checks, before --overwrite removes anything."""
    write_pairs(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.json").write_text("{}")
    config = write_bag_pairs_config(tmp_path, MINED)
    refusal(["train", config, "--overwrite", "--run-dir", str(tmp_path / "run")], capsys)
    assert (tmp_path / "run" / "metrics.json").read_text() == "{}"


@pytest.mark.parametrize(
    ("sampler", "algorithms"),
    [
        ({"name": "mined_negatives"}, {"embedding_table": {"feed_sampler": False}}),  # random, on purpose
        ({"name": "hard_class_pk", "hard_fraction": 0.0}, {}),  # P x K on purpose
        ({"name": "mined_negatives"}, {"mine": {"_component_": "my_package.MyTable"}}),  # may feed it
        ({"name": "pk"}, {}),
    ],
)
def test_a_sampler_fed_or_meant_without_a_table_is_accepted(sampler, algorithms):
    check_sampler_table(sampler, algorithms)


def test_a_table_switched_off_is_no_table():
    with pytest.raises(ConfigError, match="has no embedding_table"):
        check_sampler_table({"name": "neighbours"}, {"embedding_table": None, "hard_negative_mining": {}})


# ---------------------------------------------------------------------- resumes on the data they saved
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One epoch of mined negatives on 32 pairs, its checkpoint in ``run``."""
    folder = tmp_path_factory.mktemp("resume_data")
    write_pairs(folder)
    config = write_bag_pairs_config(folder, MINED, algorithms={"embedding_table": {}})
    main(["train", config, "--quiet", "--run-dir", str(folder / "run")])
    return folder, config


@pytest.fixture
def changed(trained):
    """The training file with one pair's passage edited, restored afterwards."""
    folder, _ = trained
    original = (folder / "train.jsonl").read_bytes()
    rows = pair_rows(32, seed=0)
    rows[3]["positive"] += " + 1"
    write_jsonl(folder / "train.jsonl", rows)
    yield folder / "train.jsonl"
    (folder / "train.jsonl").write_bytes(original)


def files_of(folder) -> list[tuple[str, int, int]]:
    """Every file under ``folder`` (links included), with its size and modification time."""
    entries = [path for path in folder.rglob("*") if not path.is_dir() or path.is_symlink()]
    return sorted(
        (str(path.relative_to(folder)), path.lstat().st_size, path.lstat().st_mtime_ns) for path in entries
    )


def resume_argv(trained, run_dir, *extra: str) -> list[str]:
    folder, config = trained
    load = f"trainer.load_path={latest_checkpoint(folder / 'run')}"
    return ["train", config, "trainer.max_duration=2ep", load, *extra, "--quiet", "--run-dir", str(run_dir)]


def test_a_resume_on_the_same_data_continues(trained, tmp_path):
    main(resume_argv(trained, tmp_path / "resumed"))
    metrics = json.loads((tmp_path / "resumed" / "metrics.json").read_text())
    assert metrics["resumed_from_epoch"] == 1 and metrics["epochs"] == 2


def test_a_resume_on_a_changed_data_file_is_refused_naming_both(trained, changed, tmp_path, capsys):
    folder, _ = trained
    line = refusal(resume_argv(trained, tmp_path / "resumed"), capsys)
    checkpoint = latest_checkpoint(folder / "run")
    assert (
        f"checkpoint {checkpoint!r} was trained on other data: data file {str(changed)!r} has changed" in line
    )
    assert "in the checkpoint" in line and "resume_on_changed_data=true" in line, line
    assert not (tmp_path / "resumed").exists()


def test_a_copy_of_a_file_is_recorded_under_its_own_path(trained, tmp_path, capsys):
    # the copy's token store is the original's (the same bytes): the checkpoint still names the copy
    folder, config = trained
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes((folder / "train.jsonl").read_bytes())
    main(["train", config, f"data.path={copy}", "--quiet", "--run-dir", str(tmp_path / "run")])
    write_jsonl(copy, pair_rows(32, seed=5))
    argv = ["train", config, f"data.path={copy}", "trainer.max_duration=2ep", "--quiet"]
    load = f"trainer.load_path={latest_checkpoint(tmp_path / 'run')}"
    line = refusal([*argv, load, "--run-dir", str(tmp_path / "resumed")], capsys)
    assert f"data file {str(copy)!r} has changed" in line and "train.jsonl" not in line, line


def test_autoresume_on_a_changed_data_file_leaves_the_run_as_it_was(trained, changed, tmp_path, capsys):
    folder, config = trained
    run_dir = shutil.copytree(folder / "run", tmp_path / "run")
    before = files_of(run_dir)
    argv = ["train", config, "trainer.max_duration=2ep", "trainer.autoresume=true", "--quiet"]
    line = refusal([*argv, "--run-dir", str(run_dir)], capsys)
    assert "(trainer.autoresume) was trained on other data: data file" in line, line
    assert files_of(run_dir) == before


def test_resume_on_changed_data_resumes_on_the_new_file(trained, changed, tmp_path):
    main(resume_argv(trained, tmp_path / "resumed", "resume_on_changed_data=true"))
    metrics = json.loads((tmp_path / "resumed" / "metrics.json").read_text())
    assert metrics["resumed_from_epoch"] == 1 and metrics["epochs"] == 2


def test_the_identity_of_feature_data_sees_one_changed_row():
    features = torch.arange(40.0).reshape(10, 4)
    splits = DatasetSplits(
        TensorStore(features, torch.arange(10) % 5), TensorStore(features[:2], [0, 1]), 5, "toy"
    )
    saved = data_identity(splits)
    assert data_changes(saved, data_identity(splits)) == []
    features[7, 1] += 1
    assert data_changes(saved, data_identity(splits)) == [
        "the training rows hold other features (another split of the same data?)"
    ]
    smaller = DatasetSplits(TensorStore(features[:8], torch.arange(8) % 4), splits.test, 5, "toy")
    assert data_changes(saved, data_identity(smaller)) == ["8 training rows where it had 10"]
