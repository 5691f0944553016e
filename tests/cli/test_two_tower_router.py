"""Two towers of two model folders embed as each folder's sentence-transformers model (of one tokenizer, or of
two: each row tokenized by its tower's), and ``export`` writes two towers of one tokenizer as
sentence-transformers' ``Router``: ``encode_query`` is the query tower, ``encode_document`` the passage tower
(frozen or trained). Exporting towers of two tokenizers, and two folders that disagree on ``Normalize``
while ``model.normalize`` is unset, are one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers")

from composer_dynsample.cli.main import main
from composer_dynsample.config import ConfigError, load_config
from composer_dynsample.config.run import build_run
from composer_dynsample.data import TextCollate
from composer_dynsample.models.sentence_folder import (
    read_model_folder,
    tokenizer_lowercases,
    tokenizer_vocabulary,
)
from tests.cli.helpers import (
    embed_input,
    export_huggingface,
    latest_checkpoint,
    one_line_error,
    write_model_folder_config,
)
from tests.data.text.helpers import pair_rows
from tests.models.folders import save_sentence_folder

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TEST_ROWS = pair_rows(8, seed=1)  # the test split write_tiny_pairs_config writes


def towers(query: Path, passage: Path, *, frozen: bool = False) -> dict:
    return {
        "name": "two_tower",
        "frozen_passages": frozen,
        "query_encoder": {"name": "transformer", "path": str(query)},
        "passage_encoder": {"name": "transformer", "path": str(passage)},
    }


def split_texts(store) -> tuple[list[str], list[bool]]:
    """The texts of a test split's rows, in its order, and which of them are queries."""
    rows = [TEST_ROWS[row] for row in store.source_rows]
    queries = [bool(query) for query in store.is_query]
    return [row["anchor" if query else "positive"] for row, query in zip(rows, queries)], queries


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[Path, Path]:
    """A query folder (CLS pooling, seed 0, max_seq_length 20) and a passage folder (mean pooling, seed 1,
    max_seq_length 10) of one tokenizer, both normalising."""
    root = tmp_path_factory.mktemp("folders")
    query = save_sentence_folder(root / "query", pooling="cls", max_seq_length=20)
    passage = save_sentence_folder(root / "passage", pooling="mean", max_seq_length=10, seed=1)
    assert tokenizer_vocabulary(query) == tokenizer_vocabulary(passage)
    return query, passage


def test_two_folders_of_one_tokenizer_embed_as_their_sentence_transformers_models(folders, tmp_path, capsys):
    from sentence_transformers import SentenceTransformer

    query, passage = folders
    config = write_model_folder_config(tmp_path, towers(query, passage))
    main(["train", config, "--run-dir", str(tmp_path / "run")])  # two batches of both towers
    capsys.readouterr()
    run = build_run(load_config(config), tmp_path / "built")  # the model as built: the folders' weights
    info, encoder = run.splits.info, run.model.encoder
    assert info.tokenizer == str(query) and info.max_length == 10  # the query's tokenizer, the smaller length
    assert (encoder.query_encoder.pooling, encoder.passage_encoder.pooling) == ("cls", "mean")
    assert run.model.normalize is True
    store = run.splits.test
    texts, queries = split_texts(store)
    with torch.no_grad():
        ours = run.model.eval().embed(TextCollate(store)(list(range(len(store))))["features"])
    assert info.num_truncated > 0  # the passages are cut to 10 tokens, as both references cut them below
    for folder, rows in ((query, queries), (passage, [not q for q in queries])):
        reference = SentenceTransformer(str(folder), device="cpu")
        reference.max_seq_length = info.max_length
        picked = [text for text, keep in zip(texts, rows) if keep]
        theirs = reference.encode(picked, convert_to_tensor=True)
        torch.testing.assert_close(ours[torch.tensor(rows)], theirs, atol=1e-5, rtol=1e-5)


def encode_routes(out: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """``encode_query`` of the test anchors and ``encode_document`` of the test positives, of ``out``."""
    from sentence_transformers import SentenceTransformer

    exported = SentenceTransformer(str(out), device="cpu")
    queries = exported.encode_query([row["anchor"] for row in TEST_ROWS], convert_to_tensor=True)
    passages = exported.encode_document([row["positive"] for row in TEST_ROWS], convert_to_tensor=True)
    return queries, passages


def embedded(config: str, checkpoint: str, source: Path, out: Path) -> tuple[np.ndarray, np.ndarray]:
    """Our embeddings of the pairs file ``source`` (``embed --input``): its anchors, its positives."""
    embed_input(config, checkpoint, source, out)
    arrays = np.load(out.with_suffix(".npz"))
    is_query = arrays["is_query"].astype(bool)
    return arrays["embeddings"][is_query], arrays["embeddings"][~is_query]


def modules_of(out: Path) -> list[str]:
    return [entry["type"].rsplit(".", 1)[-1] for entry in json.loads((out / "modules.json").read_text())]


def test_export_after_training_writes_a_router_of_the_two_towers(folders, tmp_path, capsys):
    from sentence_transformers import SentenceTransformer

    query, passage = folders
    config = write_model_folder_config(tmp_path, towers(query, passage))
    main(["train", config, "--run-dir", str(tmp_path / "run")])
    checkpoint, out = latest_checkpoint(tmp_path / "run"), tmp_path / "exported"
    main(["export", config, "--checkpoint", checkpoint, "--out", str(out)])
    capsys.readouterr()
    assert modules_of(out) == ["Router"]
    routes = json.loads((out / "router_config.json").read_text())["structure"]
    kinds = {route: [name.rsplit("_", 1)[-1] for name in names] for route, names in routes.items()}
    steps = ["Transformer", "Pooling", "Normalize"]
    assert kinds == {"query": steps, "document": steps}
    for route, pooling in (("query", "cls"), ("document", "mean")):
        folder = out / f"{route}_1_Pooling"
        assert json.loads((folder / "config.json").read_text())["pooling_mode"] == pooling
    queries, passages = encode_routes(out)
    ours_queries, ours_passages = embedded(config, checkpoint, tmp_path / "test.jsonl", tmp_path / "ours")
    np.testing.assert_allclose(queries.numpy(), ours_queries, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(passages.numpy(), ours_passages, atol=1e-5, rtol=1e-5)
    start = SentenceTransformer(str(query), device="cpu").encode([row["anchor"] for row in TEST_ROWS])
    assert not np.allclose(start, ours_queries, atol=1e-4)  # trained: not the starting query model
    card = (out / "README.md").read_text()
    assert "Two towers, written as a sentence-transformers `Router`" in card
    assert "`query` route (`encode_query`) is the query tower" in card and "model.encode_query(" in card
    assert "Query tower pooling: cls" in card and "Passage tower pooling: mean" in card
    assert f"Query tower encoder: BertModel (bert, hidden size 16), started from `{query.name}`" in card
    assert "max_seq_length: 10" in card


def test_a_frozen_passage_run_of_one_folder_exports_its_starting_passages(tmp_path, capsys):
    from sentence_transformers import SentenceTransformer

    folder = save_sentence_folder(tmp_path / "model" / "st", pooling="cls", max_seq_length=12)
    config = write_model_folder_config(tmp_path, towers(folder, folder, frozen=True))
    main(["train", config, "--run-dir", str(tmp_path / "run")])
    checkpoint, out = latest_checkpoint(tmp_path / "run"), tmp_path / "exported"
    main(["export", config, "--checkpoint", checkpoint, "--out", str(out)])
    capsys.readouterr()
    assert modules_of(out) == ["Router"]
    queries, passages = encode_routes(out)
    ours_queries, ours_passages = embedded(config, checkpoint, tmp_path / "test.jsonl", tmp_path / "ours")
    np.testing.assert_allclose(queries.numpy(), ours_queries, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(passages.numpy(), ours_passages, atol=1e-5, rtol=1e-5)
    # The frozen passage tower is the folder's model as it was: its sentence-transformers embeddings.
    start = SentenceTransformer(str(folder), device="cpu")
    np.testing.assert_allclose(
        passages.numpy(), start.encode([row["positive"] for row in TEST_ROWS]), atol=1e-5, rtol=1e-5
    )
    assert "the passage tower, frozen in training" in (out / "README.md").read_text()
    # The Hugging Face format writes one folder a tower, as it did before.
    hf = tmp_path / "hf"
    export_huggingface(config, checkpoint, hf)
    capsys.readouterr()
    assert json.loads((hf / "encoder_config.json").read_text())["class"] == "TwoTowerEncoder"
    assert (hf / "query" / "config.json").is_file() and (hf / "passage" / "config.json").is_file()


def test_two_folders_of_two_vocabularies_each_embed_with_their_own_tokenizer(tmp_path, capsys):
    from sentence_transformers import SentenceTransformer

    from tests.models.folders import TEXTS

    query = save_sentence_folder(tmp_path / "query", pooling="cls", max_seq_length=12)
    other_texts = [text.upper().replace("A", "4") + " zq xv" for text in TEXTS]  # another vocabulary
    passage = save_sentence_folder(tmp_path / "passage", pooling="mean", seed=1, texts=other_texts)
    assert tokenizer_vocabulary(query) != tokenizer_vocabulary(passage)
    config = write_model_folder_config(tmp_path, towers(query, passage))
    main(["train", config, "--run-dir", str(tmp_path / "run")])  # trains: each tower reads its own ids
    capsys.readouterr()
    run = build_run(load_config(config), tmp_path / "built")
    store = run.splits.test
    assert store.passage_tokens is not None and run.splits.info.tokenizer == str(query)
    texts, queries = split_texts(store)
    with torch.no_grad():
        start = run.model.eval().embed(TextCollate(store)(list(range(len(store))))["features"])
    for folder, rows in ((query, queries), (passage, [not q for q in queries])):
        reference = SentenceTransformer(str(folder), device="cpu")
        reference.max_seq_length = run.splits.info.max_length
        picked = [text for text, keep in zip(texts, rows) if keep]
        theirs = reference.encode(picked, convert_to_tensor=True)
        torch.testing.assert_close(start[torch.tensor(rows)], theirs, atol=1e-5, rtol=1e-5)
    # export writes a Router whose routes hold their own tokenizers: encode_query and encode_document embed
    # as the trained towers do.
    checkpoint = latest_checkpoint(tmp_path / "run")
    main(["export", config, "--checkpoint", checkpoint, "--out", str(tmp_path / "out")])
    capsys.readouterr()
    trained = build_run(load_config(config, [f"trainer.load_path={checkpoint}"]), tmp_path / "trained")
    trained.trainer.state.model.eval()
    with torch.no_grad():
        ours = trained.model.embed(TextCollate(store)(list(range(len(store))))["features"])
    exported = SentenceTransformer(str(tmp_path / "out"), device="cpu")
    for encode, rows in (
        (exported.encode_query, queries),
        (exported.encode_document, [not q for q in queries]),
    ):
        picked = [text for text, keep in zip(texts, rows) if keep]
        torch.testing.assert_close(
            ours[torch.tensor(rows)], encode(picked, convert_to_tensor=True), atol=1e-5, rtol=1e-5
        )
    assert not torch.allclose(ours, start, atol=1e-4)  # the trained towers, not the starting folders
    # embed --input tokenizes each column as its tower does: the same embeddings as the export's routes.
    queries_in, passages_in = embedded(config, checkpoint, tmp_path / "test.jsonl", tmp_path / "ours")
    routes = encode_routes(tmp_path / "out")
    np.testing.assert_allclose(queries_in, routes[0].numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(passages_in, routes[1].numpy(), atol=1e-5, rtol=1e-5)
    # --format huggingface writes each tower's folder with its own tokenizer.
    export_huggingface(config, checkpoint, tmp_path / "hf")
    capsys.readouterr()
    assert tokenizer_vocabulary(tmp_path / "hf" / "query") == tokenizer_vocabulary(query)
    assert tokenizer_vocabulary(tmp_path / "hf" / "passage") == tokenizer_vocabulary(passage)
    # A loader of one kind of text cannot feed two tokenizers: one line.
    cfg = load_config(config, [f"data={{name: texts, path: {tmp_path / 'test.jsonl'}}}"])
    with pytest.raises(ConfigError, match="tokenizes with one; use a loader of queries and passages"):
        build_run(cfg, tmp_path / "texts")


def test_two_folders_that_disagree_on_normalize_are_one_line_unless_model_normalize_says(tmp_path, capsys):
    query = save_sentence_folder(tmp_path / "query", normalize=True)
    passage = save_sentence_folder(tmp_path / "passage", normalize=False, seed=1)
    config = write_model_folder_config(tmp_path, towers(query, passage))
    error = one_line_error(capsys, ["train", config, "--run-dir", str(tmp_path / "run")])
    assert error == (
        f"composer-dynsample train: error: model.encoder.query_encoder.path {str(query)!r} and "
        f"model.encoder.passage_encoder.path {str(passage)!r} disagree on normalisation (only "
        "model.encoder.query_encoder.path lists a Normalize module) and model.normalize is unset; set "
        "model.normalize to true or false for both towers."
    )
    told = build_run(load_config(config, ["model.normalize=false"]), tmp_path / "told")
    assert told.model.normalize is False


def test_two_folders_that_lower_case_differently_read_two_tokenizations(tmp_path):
    query = save_sentence_folder(tmp_path / "query")
    passage = save_sentence_folder(tmp_path / "passage", seed=1)
    tokenizer = json.loads((passage / "tokenizer.json").read_text())
    (passage / "tokenizer.json").write_text(json.dumps({**tokenizer, "normalizer": {"type": "NFKC"}}))
    assert tokenizer_lowercases(query / "tokenizer.json") is True  # the helper's tokenizer lower-cases
    assert read_model_folder(passage).do_lower_case is False
    run = build_run(
        load_config(write_model_folder_config(tmp_path, towers(query, passage))), tmp_path / "run"
    )
    assert run.splits.train.passage_tokens is not None  # the passages tokenized as their folder does


def test_each_tower_takes_its_own_folders_prompts(tmp_path, capsys):
    from sentence_transformers import SentenceTransformer

    from tests.cli.test_prompts import with_prompts

    query = with_prompts(
        save_sentence_folder(tmp_path / "query", pooling="cls"), {"query": "query: "}, "query"
    )
    passage = with_prompts(
        save_sentence_folder(tmp_path / "passage", pooling="mean", seed=1),
        {"passage": "passage: "},
        "passage",
    )
    config = write_model_folder_config(tmp_path, towers(query, passage))
    run = build_run(load_config(config), tmp_path / "built")  # each folder's default prompt, on its side
    assert run.splits.info.prompts == {"anchor": "query: ", "positive": "passage: "}
    store = run.splits.test
    texts, queries = split_texts(store)
    with torch.no_grad():
        ours = run.model.eval().embed(TextCollate(store)(list(range(len(store))))["features"])
    for folder, name, rows in ((query, "query", queries), (passage, "passage", [not q for q in queries])):
        reference = SentenceTransformer(str(folder), device="cpu")
        reference.max_seq_length = run.splits.info.max_length
        picked = [text for text, keep in zip(texts, rows) if keep]
        theirs = reference.encode(picked, prompt_name=name, convert_to_tensor=True)
        torch.testing.assert_close(ours[torch.tensor(rows)], theirs, atol=1e-5, rtol=1e-5)
    # By name, each column's name is one of its tower's folder's prompts.
    named = build_run(
        load_config(config, ["data.prompt_names={anchor: query, positive: passage}"]), tmp_path / "named"
    )
    assert named.splits.info.prompts == run.splits.info.prompts
    with pytest.raises(
        ConfigError,
        match=rf"data.prompt_names.positive: model folder {str(passage)!r} has no prompt named 'query'",
    ):
        build_run(
            load_config(config, ["data.prompt_names={anchor: query, positive: query}"]), tmp_path / "wrong"
        )
