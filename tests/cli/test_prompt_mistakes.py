"""Prompts as a user who makes mistakes gives them: a name the model folder lacks, names that are not names
(a number, a list, an empty mapping, an empty or null name; two towers' folders too) and prompts that are
not strings are each one line; the token cache never serves the tokens of another prompt; an export keeps
the prompts the run used (a sentence-transformers folder by name, a Hugging Face folder in its
``encoder_config.json``, said in a note)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers")

from composer_dynsample.cli.main import main
from composer_dynsample.config import load_config
from composer_dynsample.config.run import build_run
from composer_dynsample.data import TextCollate
from composer_dynsample.models.sentence_folder import read_model_folder
from tests.cli.helpers import latest_checkpoint, one_line_error
from tests.cli.test_prompts import PROMPTS, with_prompts, write_config
from tests.cli.test_two_tower_folders import towers
from tests.data.text.helpers import pair_rows, write_jsonl
from tests.models.folders import save_sentence_folder

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A sentence-transformers folder (mean pooling, max_seq_length 16) with prompts 'query' and 'passage'."""
    made = save_sentence_folder(tmp_path_factory.mktemp("model") / "st", pooling="mean", max_seq_length=16)
    return with_prompts(made, PROMPTS)


@pytest.fixture
def data(tmp_path) -> Path:
    write_jsonl(tmp_path / "train.jsonl", pair_rows(32, seed=0))
    write_jsonl(tmp_path / "test.jsonl", pair_rows(8, seed=1))
    return tmp_path


def refusal(capsys: pytest.CaptureFixture[str], config: str, run_dir: Path, *overrides: str) -> str:
    """The one line ``train`` exits with, having left no run directory."""
    error = one_line_error(capsys, ["train", config, *overrides, "--quiet", "--run-dir", str(run_dir)])
    assert not run_dir.exists()
    return error.removeprefix("composer-dynsample train: error: ")


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("data.prompt_names=nope", "data.prompt_names: model folder 'FOLDER' has no prompt named 'nope'; it has 'passage' or 'query' (config_sentence_transformers.json)."),
        ("data.prompt_names=5", "data.prompt_names must name the model folder's prompts by column, e.g. {anchor: passage}, or be one name for every column; got int 5."),
        ("data.prompt_names=[query]", "data.prompt_names must name the model folder's prompts by column, e.g. {anchor: passage}, or be one name for every column; got list ['query']."),
        ("data.prompt_names={}", "data.prompt_names is an empty mapping, which names no prompt; name one of model folder 'FOLDER''s prompts ('passage' or 'query') for each column to prompt, e.g. {anchor: passage}, or leave data.prompt_names out."),
        ("data.prompt_names={anchor: null}", "data.prompt_names.anchor must be the name of one of model folder 'FOLDER''s prompts ('passage' or 'query'), got NoneType None; leave the column out for no prompt."),
        ("data.prompt_names={anchor: ''}", "data.prompt_names.anchor must be the name of one of model folder 'FOLDER''s prompts ('passage' or 'query'), got an empty name; leave the column out for no prompt."),
        ("data.prompt_names=''", "data.prompt_names must be the name of one of model folder 'FOLDER''s prompts ('passage' or 'query'), got an empty name; leave the column out for no prompt."),
        ("data.prompt_names={anchor: query, query: passage}", "data.prompt_names: no column 'query' takes a prompt; choose 'anchor', 'positive', 'negative' or 'text'."),
        ("data.prompts=5", "data: prompts must map columns to prompts, e.g. {anchor: 'query: ', positive: 'passage: '}, got int 5."),
        ("data.prompts=[a]", "data: prompts must map columns to prompts, e.g. {anchor: 'query: ', positive: 'passage: '}, got list ['a']."),
        ("data.prompts={anchor: null}", "data: prompts.anchor must be a string (the text put before each anchor), got NoneType None."),
        ("data.prompts={positive: [x]}", "data: prompts.positive must be a string (the text put before each positive), got list ['x']."),
    ],
)  # fmt: skip
def test_a_prompt_that_is_not_one_is_one_line(folder, data, capsys, override, expected):
    """Before, an empty mapping, an empty name or an empty string trained without prompts without a word,
    and a name that is not a string was called a prompt ('the text put before each anchor')."""
    config = write_config(data, folder)
    assert refusal(capsys, config, data / "run", override) == expected.replace("FOLDER", str(folder))


@pytest.fixture(scope="module")
def two_folders(tmp_path_factory, folder) -> dict:
    """Two towers of two folders of one tokenizer, each with its prompts."""
    second = save_sentence_folder(tmp_path_factory.mktemp("second") / "st", pooling="mean", seed=1)
    return towers(folder, with_prompts(second, {"doc": "doc: "}))


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("data.prompt_names=5", "data.prompt_names must name the model folder's prompts by column"),
        ("data.prompt_names=[query, doc]", "got list ['query', 'doc']."),
        ("data.prompt_names={}", "data.prompt_names is an empty mapping, which names no prompt"),
        ("data.prompt_names={anchor: query, positive: query}", "data.prompt_names.positive: model folder"),
    ],
)
def test_two_towers_prompt_names_that_are_not_names_are_one_line(
    two_folders, data, capsys, override, expected
):
    """Before, a number or a list for two folders' towers was a traceback (AttributeError)."""
    config = write_config(data, Path(two_folders["query_encoder"]["path"]))
    error = refusal(capsys, config, data / "run", f"model.encoder={json.dumps(two_folders)}", override)
    assert expected in error, error
    if "positive: query" in override:
        assert "has no prompt named 'query'; it has 'doc'" in error, error


def first_anchor(config: str, run_dir: Path, prompts: str) -> tuple[str, tuple[Path, ...], tuple[bool, ...]]:
    """The first training anchor's tokens as text, the token stores and whether they came from the cache."""
    run = build_run(load_config(config, [f"data.prompts={prompts}"]), run_dir)
    store = run.splits.train
    row = next(index for index in range(len(store)) if store.is_query[index])
    ids = TextCollate(store)([row])["features"]["input_ids"][0].tolist()
    text = run.splits.info.load_tokenizer().tokenizer.decode(ids).replace(" ##", "")
    return text, run.splits.info.cache_dirs, run.splits.info.from_cache


def test_a_changed_prompt_is_tokenized_again_never_read_from_the_old_prompt_s_cache(folder, data):
    config = write_config(data, folder)
    first, first_dirs, cached = first_anchor(config, data / "a", "{anchor: 'query: '}")
    assert first.startswith("query : how to ") and cached == (False, False), first
    second, second_dirs, cached = first_anchor(config, data / "b", "{anchor: 'search: '}")
    assert second.startswith("search : how to ") and cached == (False, False), second
    assert not set(first_dirs) & set(second_dirs)
    again, again_dirs, cached = first_anchor(config, data / "c", "{anchor: 'query: '}")
    assert (again, again_dirs, cached) == (first, first_dirs, (True, True))  # the first prompt's own cache


def test_export_keeps_the_run_s_prompts_in_both_formats(folder, data, capsys):
    used = {"anchor": "search: ", "positive": "doc: "}
    config = write_config(data, folder, prompts=used)
    main(["train", config, "--quiet", "--run-dir", str(data / "run")])
    checkpoint = latest_checkpoint(data / "run")
    main(["export", config, "--checkpoint", checkpoint, "--out", str(data / "st")])
    exported = read_model_folder(data / "st")
    assert exported.prompts == {**PROMPTS, "anchor": "search: ", "document": "doc: "}
    # round trip: a run of the exported folder names them and gets the same prompts
    again = write_config(data, data / "st", prompt_names={"anchor": "anchor", "positive": "document"})
    assert build_run(load_config(again), data / "again").splits.info.prompts == used
    capsys.readouterr()
    main(["export", config, "--checkpoint", checkpoint, "--out", str(data / "hf"), "--format", "huggingface"])
    said = capsys.readouterr().err.splitlines()
    assert json.loads((data / "hf" / "encoder_config.json").read_text())["prompts"] == used
    assert said == [
        'note: the huggingface format has no place for prompts; the run put {"anchor": "search: ", '
        '"positive": "doc: "} (by column) before its texts, kept in encoder_config.json: put them before '
        "texts yourself, or export --format sentence-transformers"
    ]
