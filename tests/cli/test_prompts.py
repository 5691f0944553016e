"""Prompts of a model folder through the command line: ``data.prompt_names`` and ``data.prompts`` put the
folder's prompts before each column's texts, the model then embeds as ``SentenceTransformer.encode(texts,
prompt_name=...)`` does, before and after ``export``; a folder's default prompt applies unasked; a folder
with prompts trained without them says so once; and each wrong use is one line."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers")

from composer_dynsample.cli.main import main
from composer_dynsample.config import load_config
from composer_dynsample.config.run import build_run
from composer_dynsample.data import TextCollate
from composer_dynsample.models.sentence_folder import read_model_folder
from tests.cli.helpers import (
    latest_checkpoint,
    one_line_error,
    pairs_data_without_tokenizer,
    write_tiny_pairs_config,
)
from tests.data.text.helpers import pair_rows, write_jsonl
from tests.models.folders import save_sentence_folder

PROMPTS = {"query": "query: ", "passage": "passage: "}


def with_prompts(folder: Path, prompts: dict[str, str], default: str | None = None) -> Path:
    """``folder`` with ``prompts`` (and ``default_prompt_name``) in its config_sentence_transformers.json."""
    settings = folder / "config_sentence_transformers.json"
    values = json.loads(settings.read_text()) if settings.is_file() else {}
    settings.write_text(json.dumps({**values, "prompts": prompts, "default_prompt_name": default}))
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A sentence-transformers folder (mean pooling, Normalize, max_seq_length 16) with E5-style prompts."""
    made = save_sentence_folder(tmp_path_factory.mktemp("model") / "st", pooling="mean", max_seq_length=16)
    return with_prompts(made, PROMPTS)


def write_config(tmp_path: Path, model_folder: Path, **data: object) -> str:
    model = {"encoder": {"name": "transformer", "path": str(model_folder)}, "loss": {"name": "info_nce"}}
    return write_tiny_pairs_config(tmp_path, pairs_data_without_tokenizer(tmp_path, **data), model, lr=0.001)


def embedded_test_split(config: str, run_dir: Path, *overrides: str) -> tuple[torch.Tensor, list[str], list]:
    """The test split embedded by the model as built: ``(embeddings, texts, is_query)``."""
    run = build_run(load_config(config, list(overrides)), run_dir)
    store = run.splits.test
    rows = [pair_rows(8, seed=1)[row] for row in store.source_rows]
    texts = [row["anchor" if query else "positive"] for row, query in zip(rows, store.is_query)]
    with torch.no_grad():
        ours = run.model.eval().embed(TextCollate(store)(list(range(len(store))))["features"])
    return ours, texts, store.is_query[: len(store)].tolist()


def theirs(
    folder: Path, texts: list[str], is_query: list[bool], names: tuple[str | None, str | None]
) -> torch.Tensor:
    """sentence-transformers' embeddings of ``texts``: queries with prompt ``names[0]``, passages ``names[1]``."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    out = torch.empty(len(texts), model.get_sentence_embedding_dimension())
    for flag, name in zip((True, False), names):
        rows = [i for i, query in enumerate(is_query) if query == flag]
        out[rows] = model.encode([texts[i] for i in rows], prompt_name=name, convert_to_tensor=True)
    return out


@pytest.fixture
def data(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", pair_rows(32, seed=0))
    write_jsonl(tmp_path / "test.jsonl", pair_rows(8, seed=1))
    return tmp_path


def test_prompt_names_embed_as_sentence_transformers_encode_with_prompt_name(folder, data):
    config = write_config(data, folder, prompt_names={"anchor": "query", "positive": "passage"})
    ours, texts, is_query = embedded_test_split(config, data / "run")
    torch.testing.assert_close(
        ours, theirs(folder, texts, is_query, ("query", "passage")), atol=1e-5, rtol=1e-5
    )
    plain, _, _ = embedded_test_split(config, data / "plain", "data.prompt_names=null", "data.prompts={}")
    assert (ours - plain).abs().max() > 1e-3  # the prompts change the embeddings: the test can fail


def test_literal_prompts_equal_the_named_ones_and_key_the_token_cache(folder, data):
    named = build_run(load_config(write_config(data, folder, prompt_names={"anchor": "query"})), data / "a")
    literal = build_run(load_config(write_config(data, folder, prompts={"anchor": "query: "})), data / "b")
    none = build_run(load_config(write_config(data, folder, prompts={})), data / "c")
    assert named.splits.info.prompts == literal.splits.info.prompts == {"anchor": "query: "}
    assert named.splits.info.cache_dirs == literal.splits.info.cache_dirs != none.splits.info.cache_dirs
    assert none.splits.info.prompts == {}


def test_a_folder_s_default_prompt_applies_unasked_as_in_encode(tmp_path, data):
    folder = with_prompts(save_sentence_folder(tmp_path / "st", pooling="mean"), PROMPTS, default="query")
    ours, texts, is_query = embedded_test_split(write_config(data, folder), data / "run")
    torch.testing.assert_close(ours, theirs(folder, texts, is_query, (None, None)), atol=1e-5, rtol=1e-5)


def test_a_folder_with_prompts_trained_without_them_warns_once_and_names_them(folder, data):
    with pytest.warns(UserWarning, match="declares prompts") as caught:
        build_run(load_config(write_config(data, folder)), data / "run")
    said = [str(w.message) for w in caught if "declares prompts" in str(w.message)]
    assert len(said) == 1 and len(said[0].splitlines()) == 1
    assert '"query: "' in said[0] and "data.prompt_names={anchor: query, positive: passage}" in said[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.filterwarnings("ignore", message=".*(truncated|max_length).*")
        try:
            build_run(load_config(write_config(data, folder, prompts={})), data / "quiet")
        except UserWarning as error:
            assert "declares prompts" not in str(error)


def test_export_writes_the_prompts_and_embed_input_takes_a_prompt_name(folder, data, capsys):
    from sentence_transformers import SentenceTransformer

    config = write_config(data, folder, prompts={"anchor": "search: ", "positive": "passage: "})
    main(["train", config, "--quiet", "--run-dir", str(data / "run")])
    checkpoint = latest_checkpoint(data / "run")
    out = data / "exported"
    main(["export", config, "--checkpoint", checkpoint, "--out", str(out)])
    exported = read_model_folder(out)
    # the folder's prompts, and the anchors' prompt under its column's name ("query" is the folder's)
    assert {**PROMPTS, "anchor": "search: "}.items() <= exported.prompts.items()
    name = next(name for name, prompt in exported.prompts.items() if prompt == "search: ")
    queries = [row["anchor"] for row in pair_rows(8, seed=1)]
    write_jsonl(data / "queries.jsonl", [{"text": text} for text in queries])
    for flag, expected in (("--prompt-name", "query"), ("--prompt", "search: ")):
        npz = data / f"q{flag}.npz"
        main(["embed", config, "--checkpoint", checkpoint, "--input", str(data / "queries.jsonl"), flag, expected, "--out", str(npz)])  # fmt: skip
        reference = SentenceTransformer(str(out), device="cpu")
        prompt_name = expected if flag == "--prompt-name" else name
        want = reference.encode(queries, prompt_name=prompt_name)
        np.testing.assert_allclose(np.load(npz)["embeddings"], want, atol=1e-5)
    error = one_line_error(capsys, ["embed", config, "--checkpoint", checkpoint, "--input", str(data / "queries.jsonl"), "--prompt-name", "nope", "--out", str(data / "e")])  # fmt: skip
    assert (
        "--prompt-name: model folder" in error
        and "no prompt named 'nope'; it has 'passage' or 'query'" in error
    ), error


@pytest.mark.parametrize(
    ("data_keys", "expected"),
    [
        ({"prompt_names": {"anchor": "question"}}, "data.prompt_names.anchor: model folder"),
        ({"prompts": {"query": "q: "}}, "no column 'query' takes a prompt here; choose 'anchor', 'positive' or 'negative'"),
        ({"prompts": {"anchor": 3}}, "data: prompts.anchor must be a string"),
        ({"prompts": {"anchor": "q: "}, "prompt_names": {"anchor": "query"}}, "data.prompts and data.prompt_names are both set"),
    ],
)  # fmt: skip
def test_a_wrong_prompt_is_one_line(folder, data, capsys, data_keys, expected):
    config = write_config(data, folder, **data_keys)
    error = one_line_error(capsys, ["train", config, "--run-dir", str(data / "run")])
    assert expected in error, error
    if "question" in str(data_keys):
        assert "it has 'passage' or 'query'" in error


def test_prompt_names_without_a_model_folder_and_a_prompt_without_input_are_one_line(data, capsys):
    config = write_tiny_pairs_config(
        data,
        pairs_data_without_tokenizer(data, prompt_names={"anchor": "query"}),
        {"encoder": {"name": "bag_of_tokens", "embedding_dim": 8}, "loss": {"name": "info_nce"}},
        lr=0.001,
    )  # fmt: skip
    error = one_line_error(capsys, ["train", config, "--run-dir", str(data / "run")])
    assert "data.prompt_names names prompts of the model folder" in error
    error = one_line_error(capsys, ["embed", config, "--checkpoint", str(data / "c.pt"), "--prompt", "q: ", "--out", str(data / "e")])  # fmt: skip
    assert "--prompt/--prompt-name 'q: ' prompts the texts of an --input file" in error


def test_a_folder_pooling_without_its_prompt_leaves_the_prompt_tokens_out_as_sentence_transformers(
    tmp_path, data
):
    """``include_prompt: false``: each row's prompt tokens (counted as sentence-transformers counts its
    ``prompt_length``) are left out of the mean, queries and passages each with their own prompt."""
    made = save_sentence_folder(tmp_path / "st", pooling="mean", include_prompt=False)
    folder = with_prompts(made, {"query": "query: find me ", "passage": "passage: "})
    config = write_config(data, folder, prompt_names={"anchor": "query", "positive": "passage"})
    ours, texts, is_query = embedded_test_split(config, data / "run")
    torch.testing.assert_close(
        ours, theirs(folder, texts, is_query, ("query", "passage")), atol=1e-5, rtol=1e-5
    )
    included = with_prompts(save_sentence_folder(tmp_path / "in", pooling="mean"), {"query": "query: find me ", "passage": "passage: "})  # fmt: skip
    config = write_config(data, included, prompt_names={"anchor": "query", "positive": "passage"})
    with_prompt, _, _ = embedded_test_split(config, data / "in-run")
    assert (with_prompt - ours).abs().max() > 1e-3  # the same weights pool otherwise: the test can fail
