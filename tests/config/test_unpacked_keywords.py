"""Keywords a target hands on (``**options: Unpack[Keywords]``, PEP 692) are keys like any other: a config
check names a misspelt one before anything is built, and a Python caller gets the error of a written-out
parameter list, naming the function it called."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, TypedDict, Unpack

import pytest
import torch

from composer_dynsample import NeighbourBatchSampler, TwoStreamBatchSampler
from composer_dynsample.config import ConfigError, load_config
from composer_dynsample.config.checks import check_config
from composer_dynsample.config.parameters import parameters, unpacked_keywords
from composer_dynsample.data.text import code_search_pairs
from composer_dynsample.data.text.pairs import load_pairs
from composer_dynsample.data.text.texts import load_texts
from composer_dynsample.metrics.ranking import ranking_metrics
from composer_dynsample.samplers import HardClassPKBatchSampler

YAMLS = Path(__file__).resolve().parents[2] / "yamls"


@pytest.mark.parametrize(
    ("recipe", "override", "key", "close"),
    [
        ("glyphs_hard_class.yaml", "sampler.seeed=1", "seeed", "seed"),
        ("glyphs_hard_class.yaml", "sampler.small_clases=replace", "small_clases", "small_classes"),
        ("glyphs_neighbours.yaml", "sampler.drop_lats=false", "drop_lats", "drop_last"),
        ("finetune_code_search.yaml", "data.vocab_sise=512", "vocab_sise", "vocab_size"),
        ("finetune_code_search.yaml", "data.kinds=docstring", "kinds", "kind"),
    ],
)
def test_a_misspelt_handed_on_key_is_refused_when_the_config_is_checked(recipe, override, key, close):
    cfg = load_config(YAMLS / recipe, [override])
    with pytest.raises(ConfigError) as caught:
        check_config(cfg)
    message = str(caught.value)
    assert repr(key) in message and repr(close) in message and "\n" not in message


def test_handed_on_keys_are_checked_for_their_type_and_accepted_when_right():
    with pytest.raises(ConfigError, match=r"data\.vocab_size must be an integer, got 'big'"):
        check_config(load_config(YAMLS / "code_search.yaml", ["data.vocab_size=big"]))
    check_config(load_config(YAMLS / "code_search.yaml", ["data.kind=docstring", "data.stdlib=false"]))
    check_config(load_config(YAMLS / "glyphs_hard_class.yaml", ["sampler.small_classes=replace"]))


@pytest.mark.parametrize(
    ("call", "name", "close"),
    [
        (lambda: load_pairs("pairs.jsonl", vocab=64), "load_pairs", "vocab_size"),
        (lambda: load_texts("texts.csv", passage_tokenizer="t.json"), "load_texts", None),
        (lambda: code_search_pairs.load_code_search(kinds="docstring"), "load_code_search", "kind"),
        (lambda: TwoStreamBatchSampler(range(4), range(4, 6), 2, 1, sed=1), "TwoStreamBatchSampler", "seed"),
        (lambda: NeighbourBatchSampler(torch.arange(12) % 3, 1, 1, rnk=0), "NeighbourBatchSampler", "rank"),
        (lambda: HardClassPKBatchSampler(torch.arange(8) % 4, 2, 2, dropp_last=False), "HardClassPKBatchSampler",
         "drop_last"),
        (lambda: ranking_metrics(torch.eye(2), torch.arange(2), torch.eye(2), torch.arange(2), recall_k=[1]),
         "ranking_metrics", "recall_ks"),
    ],
)  # fmt: skip
def test_a_python_caller_gets_the_unknown_keyword_error_of_the_function_it_called(call, name, close):
    with pytest.raises(TypeError) as caught:
        call()
    message = str(caught.value)
    assert message.startswith(f"{name}() got an unexpected keyword argument")
    assert (f"Did you mean {close!r}?" in message) == (close is not None)


def test_load_code_search_hands_the_corpus_keys_to_the_builder_and_the_rest_to_load_pairs(
    monkeypatch, tmp_path
):
    seen: dict[str, dict[str, Any]] = {}

    class Built:
        train_path, test_path = tmp_path / "train.jsonl", tmp_path / "test.jsonl"

    def build(root, **keys):
        seen["build"] = {"root": root, **keys}
        return Built()

    def load(path, **keys):
        seen["load"] = {"path": path, **keys}
        return "splits"

    monkeypatch.setattr(code_search_pairs, "build_code_search", build)
    monkeypatch.setattr(code_search_pairs, "load_pairs", load)
    result = code_search_pairs.load_code_search(
        kind="docstring", stdlib=False, groups=["numpy"], seed=3, vocab_size=512, cache_dir=tmp_path, progress=False,
        max_length=64,
    )  # fmt: skip
    assert result == "splits"
    assert seen["build"] == {
        "root": tmp_path / "code_search", "progress": False, "kind": "docstring", "stdlib": False,
        "groups": ["numpy"], "seed": 3,
    }  # fmt: skip
    assert seen["load"] == {
        "path": Built.train_path, "test_path": Built.test_path, "max_length": 64, "name": "code_search",
        "prompts": None, "vocab_size": 512, "cache_dir": tmp_path / "text", "progress": False,
    }  # fmt: skip


class _Shard(TypedDict, total=False):
    rank: int
    seed: int


def _takes(a: int, **options: Unpack[_Shard]) -> None: ...


def _takes_anything(a: int, **options: Any) -> None: ...


def test_only_a_typed_dict_unpacks():
    assert [(p.name, p.kind, p.annotation) for p in parameters(_takes).values()] == [
        ("a", inspect.Parameter.POSITIONAL_OR_KEYWORD, "int"),
        ("rank", inspect.Parameter.KEYWORD_ONLY, int),
        ("seed", inspect.Parameter.KEYWORD_ONLY, int),
    ]
    assert list(parameters(_takes_anything)) == ["a", "options"]
    assert unpacked_keywords(Any) is None and unpacked_keywords(dict[str, int]) is None
