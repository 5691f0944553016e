"""Two-tower folders, progress lines and section overrides as a user who makes mistakes meets them: two
towers export with the trained weights in both formats, a passage folder without a tokenizer is one line;
progress lines written to a log file are plain lines that count on across epochs and a resume, and each
bad value is one line; a section override that names no component is one line, with no note before it."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

pytest.importorskip("tokenizers")

from composer_dynsample.cli.main import main
from tests.cli.helpers import (
    latest_checkpoint,
    one_line_error,
    write_bag_pairs_config,
    write_model_folder_config,
    write_pairs,
)
from tests.cli.test_progress_lines import LAST, LINE
from tests.cli.test_two_tower_folders import towers

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

PK = {"name": "pk", "classes_per_batch": 8, "samples_per_class": 2}  # 32 pairs: 4 batches an epoch


@pytest.fixture(scope="module")
def two_tower_run(tmp_path_factory) -> tuple[Path, Path, dict[str, torch.Tensor]]:
    """Two towers of two BERT folders (one tokenizer), both trained 2 steps: ``(folder, run directory,
    the checkpoint's encoder weights by tower)``."""
    pytest.importorskip("transformers")
    from tests.models.folders import save_bert_folder

    folder = tmp_path_factory.mktemp("towers")
    encoder = towers(save_bert_folder(folder / "first"), save_bert_folder(folder / "second", seed=1))
    config = write_model_folder_config(folder, {**encoder, "frozen_passages": False})
    main(["train", config, "--quiet", "--run-dir", str(folder / "run")])
    state = torch.load(latest_checkpoint(folder / "run"), map_location="cpu", weights_only=False)
    weights = {
        k.removeprefix("encoder."): v for k, v in state["state"]["model"].items() if k.startswith("encoder.")
    }
    return folder, folder / "run", weights


def tower_weights(weights: dict[str, torch.Tensor], tower: str) -> dict[str, torch.Tensor]:
    """A tower's transformer weights, named as its ``AutoModel`` names them."""
    prefix = f"{tower}.model."
    return {key.removeprefix(prefix): value for key, value in weights.items() if key.startswith(prefix)}


def assert_same_weights(saved: dict[str, torch.Tensor], trained: dict[str, torch.Tensor]) -> None:
    """Every trained weight is in ``saved``, equal to the bit (``saved`` may add the pooler)."""
    assert trained and set(trained) <= set(saved), sorted(set(trained) - set(saved))
    for key, value in trained.items():
        assert torch.equal(saved[key], value), key


def test_two_towers_export_their_trained_weights_in_both_formats(two_tower_run):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    from composer_dynsample.export import load_exported_encoder

    folder, run_dir, weights = two_tower_run
    main(["export", "--run", str(run_dir), "--out", str(folder / "hf"), "--format", "huggingface"])
    loaded = load_exported_encoder(folder / "hf").state_dict()
    assert_same_weights(loaded, weights)
    main(["export", "--run", str(run_dir), "--out", str(folder / "st")])
    router = SentenceTransformer(str(folder / "st"), device="cpu")[0]
    for route, tower in (("query", "query_encoder"), ("document", "passage_encoder")):
        assert_same_weights(
            router.sub_modules[route][0].auto_model.state_dict(), tower_weights(weights, tower)
        )
    # the towers trained: the folders' weights are not what was exported
    start = AutoModel.from_pretrained(str(folder / "first")).state_dict()
    query = tower_weights(weights, "query_encoder")
    assert any(not torch.equal(start[key], value) for key, value in query.items())


def test_a_passage_folder_without_a_tokenizer_is_one_line(two_tower_run, tmp_path, capsys):
    """Before, the query folder's tokenizer fed the passage model ids it was not trained on, unsaid."""
    transformers = pytest.importorskip("transformers")
    folder, _, _ = two_tower_run
    bare = tmp_path / "bare"
    config = transformers.BertConfig(vocab_size=300, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=64)  # fmt: skip
    transformers.BertModel(config).save_pretrained(bare)
    path = write_model_folder_config(tmp_path, towers(folder / "first", bare), max_length=24)
    run_dir = tmp_path / "run"
    error = one_line_error(capsys, ["train", path, "--quiet", "--run-dir", str(run_dir)])
    assert error == (
        f"composer-dynsample train: error: model.encoder.passage_encoder.path '{bare}' holds no tokenizer "
        "(tokenizer.json, vocab.txt, ...), so the ids its model was trained on are unknown, and "
        "model.encoder.query_encoder.path's tokenizer would feed it; give that tower a folder with its "
        "tokenizer, or set data.tokenizer to the one both towers read."
    )
    assert not run_dir.exists()


@pytest.fixture
def config(tmp_path) -> str:
    write_pairs(tmp_path)
    return write_bag_pairs_config(tmp_path, PK)


EVERY_2 = "callbacks.progress_lines={every_batches: 2, every_seconds: null}"


def logged(config: str, log: Path, *options: str) -> list[str]:
    """``train`` with stdout a log file (not a terminal): the log's lines."""
    with log.open("w") as file, contextlib.redirect_stdout(file):
        main(["train", config, EVERY_2, *options])
    text = log.read_text()
    assert "\r" not in text and "\x1b" not in text  # no bar redrawn, no terminal colours
    return [line for line in text.splitlines() if line.startswith("step ")]


def test_progress_lines_in_a_log_count_on_over_epochs_and_a_resume(config, tmp_path):
    first = logged(
        config, tmp_path / "first.log", "trainer.max_duration=1ep", "--run-dir", str(tmp_path / "a")
    )
    load = f"trainer.load_path={latest_checkpoint(tmp_path / 'a')}"
    resumed = logged(
        config, tmp_path / "more.log", "trainer.max_duration=3ep", load, "--run-dir", str(tmp_path / "b")
    )
    for lines in (first, resumed):
        assert all(LINE.fullmatch(line) for line in lines[:-1]) and LAST.fullmatch(lines[-1]), lines
    assert [line.split(" loss ")[0] for line in first] == ["step 2/4 (epoch 0)", "step 4/4 (end of epoch 0)"]
    assert [line.split(" loss ")[0] for line in resumed] == [
        "step 6/12 (epoch 1)",
        "step 8/12 (epoch 1)",
        "step 10/12 (epoch 2)",
        "step 12/12 (end of epoch 2)",
    ]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("{every_seconds: -1}", "ProgressLines(every_seconds=-1) rejected the config: every_seconds must be a number > 0, got -1."),
        ("{every_seconds: 0}", "every_seconds must be a number > 0, got 0."),
        ("{every_seconds: .nan}", "every_seconds must be a finite number > 0, got nan."),
        ("{every_seconds: .inf}", "every_seconds must be a finite number > 0, got inf."),
        ("{every_batches: ten}", "callbacks.progress_lines.every_batches must be an integer or null, got 'ten' (a string)."),
        ("{every_batches: 2.5}", "callbacks.progress_lines.every_batches must be an integer or null, got 2.5 (a number)."),
        ("{every_batches: true}", "every_batches must be an integer >= 1, got True."),
        ("{every_batch: 2}", "unknown key 'every_batch' for 'progress_lines'; valid keys: ['every_batches', 'every_seconds']. Did you mean 'every_batches'?"),
        ("true", "callbacks.progress_lines must be a mapping of keyword arguments ({} for the defaults) or null, got True."),
        ("[2]", "callbacks.progress_lines must be a mapping of keyword arguments ({} for the defaults) or null, got [2]."),
    ],
)  # fmt: skip
def test_a_bad_progress_lines_value_is_one_line(config, tmp_path, capsys, value, expected):
    run_dir = tmp_path / "run"
    error = one_line_error(
        capsys, ["train", config, f"callbacks.progress_lines={value}", "--run-dir", str(run_dir)]
    )
    assert expected in error, error
    assert not run_dir.exists()


@pytest.mark.parametrize(
    ("override", "section", "names"),
    [
        ("sampler={classes_per_batch: 4}", "sampler", "['hard_class_pk', 'mined_negatives', 'neighbours', 'pk', 'two_stream']"),
        ("model.loss={temperature: 0.2}", "model.loss", "['contrastive', 'info_nce', 'multi_similarity', 'triplet_margin']"),
        ("optimizer={lr: 0.1}", "optimizer", "['adam', 'adamw', 'sgd']"),
    ],
)  # fmt: skip
def test_a_section_override_naming_no_component_is_one_line_without_a_note(
    config, tmp_path, capsys, override, section, names
):
    """Before, a note on the keys left out (the name among them) came before the error: two lines."""
    run_dir = tmp_path / "run"
    error = one_line_error(capsys, ["train", config, override, "--quiet", "--run-dir", str(run_dir)])
    assert error == (
        f"composer-dynsample train: error: {section} needs a 'name' (valid names: {names}) or a '_component_' "
        "such as 'my_package.MyClass'."
    )
    assert not run_dir.exists()
