"""Signatures read from source agree with ``inspect.signature`` of the imported targets."""

from __future__ import annotations

import inspect

import pytest

from composer_dynsample.config.components import Lazy, Registered
from composer_dynsample.config.names import ALGORITHMS, CALLBACKS, DATASETS, LOGGERS, SAMPLERS, SCHEDULERS
from composer_dynsample.config.parameters import parameters
from composer_dynsample.config.signatures import SourceRegistry, source_signature

# check_config reads the first four from source; the data and sampler sections it checks against the
# imported targets, and they are read from source here too, as targets that hand keywords on
# (**options: Unpack[...]) stand among them.
_READ_FROM_SOURCE = (
    ("algorithms", ALGORITHMS),
    ("callbacks", CALLBACKS),
    ("loggers", LOGGERS),
    ("scheduler", SCHEDULERS),
)
_IMPORTED = (("data", DATASETS), ("sampler", SAMPLERS))
ENTRIES = [
    (kind, name, entry)
    for kind, registry in (*_READ_FROM_SOURCE, *_IMPORTED)
    for name, entry in registry.items()
    if isinstance(entry, Lazy)
]


def _shape(signature: inspect.Signature) -> list[tuple[str, object, bool]]:
    return [(p.name, p.kind, p.default is inspect.Parameter.empty) for p in signature.parameters.values()]


@pytest.mark.parametrize(("kind", "name", "entry"), ENTRIES, ids=[f"{k}.{n}" for k, n, _ in ENTRIES])
def test_registry_targets_read_from_source_match_their_imported_signature(kind, name, entry):
    assert isinstance(entry, Lazy)
    try:
        target = entry.get()
    except ImportError:
        pytest.skip(f"{entry.module} is an optional dependency")
    from_source = source_signature(entry.module, entry.attribute)
    if from_source is None:  # an inherited __init__: the builder checks the keys instead
        assert "__init__" not in vars(target)
        return
    imported = Registered(target, entry.reserved, entry.inferred, entry.extra).valid_keys()
    assert SourceRegistry({name: entry})[name].valid_keys() == imported
    assert _shape(from_source) == _shape(inspect.Signature(list(parameters(target).values())))


def test_the_trainer_and_the_model_read_from_source_match():
    from composer import Trainer

    from composer_dynsample import EmbeddingModel

    for module, name, target in (
        ("composer.trainer.trainer", "Trainer", Trainer),
        ("composer_dynsample.models.embedding_model", "EmbeddingModel", EmbeddingModel),
    ):
        expected = [key for key in inspect.signature(target).parameters if key != "self"]
        assert list(source_signature(module, name).parameters) == expected


def test_what_the_source_does_not_settle_is_none():
    assert source_signature("no_such_package.module", "Name") is None
    assert source_signature("composer_dynsample.validation", "NoSuchName") is None
    # A class whose __init__ comes from its base (ConfigError subclasses ValueError).
    assert source_signature("composer_dynsample.config.components", "ConfigError") is None


def test_handed_on_keywords_are_read_through_typing_names_bases_and_imports(tmp_path, monkeypatch):
    package = tmp_path / "unpack_probe"
    package.mkdir()
    (package / "__init__.py").write_text("from unpack_probe.targets import build\n")
    (package / "keywords.py").write_text(
        "import typing\n\n"
        "class Shard(typing.TypedDict, total=False):\n    rank: int\n    seed: int\n\n"
        "class Batch(Shard, total=False):\n    drop_last: bool\n"
    )
    (package / "targets.py").write_text(
        "import typing\nfrom unpack_probe.keywords import Batch\n\n"
        "def build(size: int, **options: typing.Unpack[Batch]) -> None: ...\n\n"
        "def plain(size: int, **options: typing.Any) -> None: ...\n\n"
        "def unknown(size: int, **options: typing.Unpack[Missing]) -> None: ...\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    read = source_signature("unpack_probe", "build")
    assert [(p.name, p.kind) for p in read.parameters.values()] == [
        ("size", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("rank", inspect.Parameter.KEYWORD_ONLY),
        ("seed", inspect.Parameter.KEYWORD_ONLY),
        ("drop_last", inspect.Parameter.KEYWORD_ONLY),
    ]
    for name in ("plain", "unknown"):  # not a TypedDict the source settles: any key, for the builder to check
        assert list(source_signature("unpack_probe.targets", name).parameters) == ["size", "options"]
