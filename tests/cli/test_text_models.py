"""Transformer encoders through the command line: position limits, quiet loading, export destinations,
the exported files' modes and what the metrics table and the help say."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

from composer_dynsample.cli.main import main
from composer_dynsample.cli.reporting import format_metrics_table, metrics_table_title
from tests.cli.helpers import latest_checkpoint, one_line_error, pairs_data, write_tiny_pairs_config
from tests.data.text.helpers import pair_rows

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TINY_BERT = {
    "model_type": "bert",
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 32,
}


def write_config(folder: Path, encoder: dict, **data: object) -> str:
    """A pairs config of ``folder``'s tiny train and test files with ``encoder``, 2 batches, no evaluation."""
    model = {"normalize": True, "encoder": encoder, "loss": {"name": "info_nce", "temperature": 0.1}}
    return write_tiny_pairs_config(folder, pairs_data(folder, **data), model, lr=0.01)


def save_bert(folder: Path, max_position_embeddings: int = 64) -> Path:
    """A tiny BERT saved with ``save_pretrained``, its pooler's weights included, and a tokenizer of the
    test pairs' words: a model folder is the whole model, its tokenizer included."""
    import transformers

    from composer_dynsample.data.text.tokenizer import train_tokenizer
    from composer_dynsample.export import pretrained_tokenizer

    sizes = {key: value for key, value in TINY_BERT.items() if key != "model_type"}
    config = transformers.BertConfig(vocab_size=300, max_position_embeddings=max_position_embeddings, **sizes)
    transformers.BertModel(config, add_pooling_layer=True).save_pretrained(folder)
    texts = [text for row in pair_rows(32, seed=0) for text in row.values()]
    pretrained_tokenizer(train_tokenizer(texts, vocab_size=200)).save_pretrained(folder)
    return folder


# data.max_length and the transformer's positions


def test_max_length_beyond_a_config_s_positions_is_one_line(tmp_path, capsys):
    bert = {**TINY_BERT, "max_position_embeddings": 32}
    config = write_config(tmp_path, {"name": "transformer", "config": bert})
    argv = ["train", config, "data.max_length=48", "--run-dir", str(tmp_path / "run")]
    error = one_line_error(capsys, argv)
    assert error.startswith("composer-dynsample train: error: data.max_length is 48 but ")
    assert "model.encoder.config.max_position_embeddings is 32" in error
    assert "set data.max_length to at most 32" in error
    assert not (tmp_path / "run").exists()
    assert not (tmp_path / "cache").exists()  # refused when the config is checked: no data read


def test_max_length_beyond_a_model_type_s_default_positions_is_one_line(tmp_path, capsys):
    config = write_config(tmp_path, {"name": "transformer", "config": TINY_BERT})
    argv = ["train", config, "data.max_length=600", "--run-dir", str(tmp_path / "run")]
    error = one_line_error(capsys, argv)
    assert (
        "data.max_length is 600 but model.encoder.config.max_position_embeddings is left at 512, the default "
        "for model_type 'bert'" in error
    )
    assert not (tmp_path / "run").exists()
    assert not (tmp_path / "cache").exists()  # refused when the config is checked: no data read


def test_max_length_beyond_a_model_folder_s_positions_is_one_line(tmp_path, capsys):
    bert = save_bert(tmp_path / "bert", max_position_embeddings=64)
    capsys.readouterr()  # the progress bar of save_pretrained
    config = write_config(tmp_path, {"name": "transformer", "path": str(bert)})
    argv = ["train", config, "data.max_length=100", "--run-dir", str(tmp_path / "run")]
    error = one_line_error(capsys, argv)
    assert "data.max_length is 100 but the model of model.encoder.path" in error
    assert "has max_position_embeddings 64 (its config.json)" in error and str(bert) in error
    assert not (tmp_path / "run").exists()
    assert not (tmp_path / "cache").exists()  # refused when the config is checked: no data read


def test_check_positions_reads_the_config_without_loading_data(tmp_path):
    from omegaconf import OmegaConf

    from composer_dynsample.config import ConfigError
    from composer_dynsample.config.model_checks import check_positions

    roberta = {"model_type": "roberta", "max_position_embeddings": 514}
    cfg = {"data": {"name": "pairs", "path": str(tmp_path / "absent.jsonl"), "max_length": 513}}
    with pytest.raises(ConfigError, match=r"'roberta' keeps 2 of them for padding: 512 tokens\)") as error:
        check_positions(
            OmegaConf.create({**cfg, "model": {"encoder": {"name": "transformer", "config": roberta}}})
        )
    assert "or model.encoder.config.max_position_embeddings to at least 515" in str(error.value)
    fits = {**cfg, "data": {**cfg["data"], "max_length": 512}}
    check_positions(
        OmegaConf.create({**fits, "model": {"encoder": {"name": "transformer", "config": roberta}}})
    )
    towers = {
        "name": "two_tower",
        "query_encoder": {"name": "bag_of_tokens"},
        "passage_encoder": {"name": "transformer", "config": {**TINY_BERT, "max_position_embeddings": 16}},
    }
    with pytest.raises(
        ConfigError, match=r"model\.encoder\.passage_encoder\.config\.max_position_embeddings is 16"
    ):
        check_positions(OmegaConf.create({**cfg, "model": {"encoder": towers}}))
    unset = {"data": {"name": "pairs", "path": "x.jsonl"}}  # the loader's default max_length, 128
    with pytest.raises(ConfigError, match=r"data\.max_length is 128 but"):
        check_positions(OmegaConf.create({**unset, "model": {"encoder": towers}}))


# export --out


def test_export_out_under_a_file_is_refused_before_the_checkpoint_is_read(tmp_path, capsys):
    config = write_config(tmp_path, {"name": "transformer", "config": TINY_BERT})
    (tmp_path / "file").write_text("x")
    absent = str(tmp_path / "absent.pt")  # a checkpoint read first would be the error instead
    error = one_line_error(
        capsys, ["export", config, "--checkpoint", absent, "--out", str(tmp_path / "file" / "st")]
    )
    assert error.startswith("composer-dynsample export: error: --out ")
    assert f"{str(tmp_path / 'file')!r} is a file, not a directory" in error


def test_export_out_in_a_folder_that_cannot_be_written_is_refused_before_the_checkpoint_is_read(
    tmp_path, capsys, monkeypatch
):
    config = write_config(tmp_path, {"name": "transformer", "config": TINY_BERT})
    locked = tmp_path / "locked"
    locked.mkdir()
    absent = str(tmp_path / "absent.pt")
    argv = ["export", config, "--checkpoint", absent, "--out", str(locked / "a" / "st")]
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != locked and access(path, mode))
    error = one_line_error(capsys, argv)
    assert f"the folder {str(locked)!r} is not writable (permission denied)" in error
    assert not (locked / "a").exists()


@pytest.mark.skipif(sys.platform == "win32" or os.geteuid() == 0, reason="root writes in a read-only folder")
def test_export_out_in_a_read_only_folder_is_one_line(tmp_path, capsys):
    config = write_config(tmp_path, {"name": "transformer", "config": TINY_BERT})
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        error = one_line_error(
            capsys, ["export", config, "--checkpoint", str(tmp_path / "c.pt"), "--out", str(locked / "st")]
        )
    finally:
        locked.chmod(0o700)
    assert f"the folder {str(locked)!r} is not writable" in error


# a model folder through train and export: quiet loading, one line on the pooler, file modes


def test_train_and_export_of_a_model_folder_print_no_load_report(tmp_path, capfd, transformers_log):
    pytest.importorskip("sentence_transformers")
    bert = save_bert(tmp_path / "bert")
    capfd.readouterr()
    config = write_config(tmp_path, {"name": "transformer", "path": str(bert), "embedding_dim": 8})
    main(["train", config, "--run-dir", str(tmp_path / "run")])
    main(
        ["export", config, "--checkpoint", latest_checkpoint(tmp_path / "run"), "--out", str(tmp_path / "st")]
    )
    out, err = capfd.readouterr()
    printed = out + err + transformers_log.getvalue()
    for noise in (
        "\x1b",
        "[1m",
        "LOAD REPORT",
        "MISSING",
        "UNEXPECTED",
        "newly initialized",
        "Loading weights",
    ):
        assert noise not in printed, noise
    assert f"model {bert}: its pooler (pooler.dense) is not used by mean/CLS pooling and was dropped." in out
    assert "random weights" not in out  # the export writes the folder's pooler back
    umask = os.umask(0o022)
    os.umask(umask)
    modes = {
        str(path.relative_to(tmp_path / "st")): stat.S_IMODE(path.stat().st_mode)
        for path in (tmp_path / "st").rglob("*")
        if path.is_file()
    }
    assert "model.safetensors" in modes and set(modes.values()) == {0o666 & ~umask}, modes


@pytest.mark.parametrize("export_format", ["sentence-transformers", "huggingface"])
def test_an_exported_folder_loads_with_the_folder_s_pooler_and_nothing_newly_initialised(
    tmp_path, capfd, transformers_log, export_format
):
    """The encoder drops the pooler it does not use; the export writes the folder's back, so that
    ``AutoModel.from_pretrained`` (and sentence-transformers through it) initialises nothing on load."""
    if export_format == "sentence-transformers":
        pytest.importorskip("sentence_transformers")
    import torch
    import transformers

    bert = save_bert(tmp_path / "bert")
    config = write_config(tmp_path, {"name": "transformer", "path": str(bert)})
    main(["train", config, "--quiet", "--run-dir", str(tmp_path / "run")])
    out = tmp_path / "exported"
    checkpoint = latest_checkpoint(tmp_path / "run")
    main(["export", config, "--checkpoint", checkpoint, "--out", str(out), "--format", export_format])
    capfd.readouterr()
    start = len(transformers_log.getvalue())
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_warning()
    try:
        loaded = transformers.AutoModel.from_pretrained(str(out))
    finally:
        transformers.logging.set_verbosity(verbosity)
    printed = transformers_log.getvalue()[start:] + capfd.readouterr().err
    assert "newly initialized" not in printed and "MISSING" not in printed, printed
    folder = transformers.AutoModel.from_pretrained(str(bert))
    assert torch.equal(loaded.pooler.dense.weight, folder.pooler.dense.weight)
    assert torch.equal(loaded.pooler.dense.bias, folder.pooler.dense.bias)


# what the metrics table and the help say


def test_the_csn_row_names_the_candidates_each_query_is_ranked_among():
    metrics = {"mrr": 0.5, "csn_mrr": 0.6}
    assert "MRR (CodeSearchNet, 500 candidates)  0.6000" in format_metrics_table(metrics, gallery_size=500)
    assert "MRR (CodeSearchNet, 1000 candidates)" in format_metrics_table(metrics, gallery_size=4000)
    assert "MRR (CodeSearchNet, up to 1000 candidates)" in format_metrics_table(metrics)


def test_the_table_title_names_the_data_set_apart_from_the_test_queries():
    title = metrics_table_title("train2k", 500, "test queries vs test passages", 500)
    assert title == "train2k: final retrieval metrics of 500 test queries vs 500 test passages"
    assert metrics_table_title("glyphs", 40, "leave-one-out among the test items", 39).endswith(
        "40 test queries leave-one-out among themselves (unseen classes)"
    )
    assert metrics_table_title("digits", 30, "test queries vs train gallery", 120).endswith(
        "vs 120 train items"
    )


def test_train_help_says_which_data_get_embeddings_png(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "embeddings.png (the test embeddings' PCA) for all data but text pairs" in help_text


def test_the_license_is_an_spdx_expression_for_setuptools_77():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert project["build-system"]["requires"] == ["setuptools>=77"]


def test_the_table_names_the_real_candidates_and_the_data_set(tmp_path, capsys):
    config = write_config(tmp_path, {"name": "bag_of_tokens", "token_dim": 8})
    main(["train", config, "--run-dir", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert "test: final retrieval metrics of 8 test queries vs 8 test passages" in out  # test.jsonl's
    assert "MRR (CodeSearchNet, 8 candidates)" in out and "1000" not in out
    main(
        [
            "eval",
            config,
            "--checkpoint",
            latest_checkpoint(tmp_path / "run"),
            "--out",
            str(tmp_path / "e.json"),
        ]
    )
    assert "MRR (CodeSearchNet, 8 candidates)" in capsys.readouterr().out
