"""A mapping override on the command line replaces its section: one note on stderr names the keys of the
file it leaves out, unless the mapping names another component, whose keys those were not."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("tokenizers")

from composer_dynsample.cli.main import main
from tests.cli.helpers import MINED, write_bag_pairs_config, write_pairs

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

PK = {"name": "pk", "classes_per_batch": 8, "samples_per_class": 2}


def notes(capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The ``note:`` lines printed on stderr since the last call."""
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]


def train(folder: Path, config: str, *overrides: str) -> None:
    main(
        ["train", config, *overrides, "trainer.max_duration=1ba", "--quiet", "--run-dir", str(folder / "run")]
    )


def _notes_of_own_pairs(folder: Path, config: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """Train ``config`` with ``data={name: pairs, ...}`` of ``folder``'s pairs (no max_length): its notes."""
    data = (
        f"data={{name: pairs, path: {folder / 'train.jsonl'}, test_path: {folder / 'test.jsonl'}, "
        f"vocab_size: 200, cache_dir: {folder / 'cache'}}}"
    )
    capsys.readouterr()
    train(folder, config, data)
    return notes(capsys)


def test_a_data_mapping_without_a_key_of_the_file_is_noted_once(tmp_path, capsys):
    write_pairs(tmp_path)
    config = write_bag_pairs_config(tmp_path, PK)  # data.max_length: 24
    assert _notes_of_own_pairs(tmp_path, config, capsys) == [
        "note: data={...} replaced the data section; the config's max_length: 24 is not in it (add it to the "
        "mapping, or set data.max_length=24 after it)"
    ]
    assert (tmp_path / "run" / "metrics.json").is_file()  # a note, not an error


def test_a_mapping_naming_another_component_is_not_noted(tmp_path, capsys):
    write_pairs(tmp_path)
    config = write_bag_pairs_config(tmp_path, PK, algorithms={"embedding_table": {}})
    mined = "sampler={" + ", ".join(f"{key}: {value}" for key, value in MINED.items()) + "}"
    capsys.readouterr()
    train(tmp_path, config, mined)  # pk's classes_per_batch and samples_per_class are not mined_negatives'
    assert notes(capsys) == []
    assert (tmp_path / "run" / "metrics.json").is_file()


def test_a_text_loader_replacing_another_keeps_the_length_and_says_so(tmp_path, capsys):
    """The first fine-tuning trap: the recipe's code_search section sets max_length 128, and a user's own pairs
    as data={name: pairs, ...} dropped it with no note (the note compared the same loader only), so the run
    used another length and its config.yaml did not say which."""
    import yaml

    write_pairs(tmp_path)
    config = write_bag_pairs_config(tmp_path, PK)
    text = yaml.safe_load(Path(config).read_text())
    text["data"] = {"name": "code_search", "max_length": 20, "groups": ["stdlib:json"]}
    Path(config).write_text(yaml.safe_dump(text))
    assert _notes_of_own_pairs(tmp_path, config, capsys) == [
        "note: data={...} replaced the data section; max_length: 20 carried over from it, as every text loader "
        "takes it (set data.NAME=... after it to change)"
    ]
    used = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["data"]
    assert used["max_length"] == 20 and used["name"] == "pairs"
