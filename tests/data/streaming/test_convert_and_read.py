"""``convert_to_mds`` then ``load_streaming``: the splits read back by index are the splits loaded from the file
(rows, labels, queries, given negatives, text hashes, lengths), the samplers are built without a shard, and a
changed or incomplete folder is one line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("streaming")

from composer_dynsample.data import TextCollate, load_digits
from composer_dynsample.data.streaming import StreamingDataError, convert_to_mds, load_streaming
from composer_dynsample.data.streaming.manifest import LOCAL_INFO
from composer_dynsample.data.text.texts import load_texts
from composer_dynsample.samplers import PKBatchSampler
from tests.data.streaming.helpers import assert_same_batches, pairs_splits, some_batches
from tests.data.text.helpers import write_texts


def _shards(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.rglob("shard.*"))


def test_pairs_read_back_by_index_are_the_file_rows(tmp_path):
    splits = pairs_splits(tmp_path)
    convert_to_mds(splits, tmp_path / "mds", shard_size="4kb")
    assert len(_shards(tmp_path / "mds" / "train")) > 4  # several shards: rows cross shard boundaries
    streamed = load_streaming(str(tmp_path / "mds"), tmp_path / "local")
    assert streamed.test_protocol == splits.test_protocol and streamed.num_classes == splits.num_classes
    for name in ("train", "test"):
        want, got = getattr(splits, name), getattr(streamed, name)
        assert (len(got), got.num_rows) == (len(want), want.num_rows)
        for key in (
            "row_labels",
            "is_query",
            "negative_offsets",
            "negative_rows",
            "source_rows",
            "text_hash",
        ):
            assert np.array_equal(getattr(want, key), getattr(got, key)), key
        rows = np.arange(want.num_rows)
        assert np.array_equal(want.lengths(rows), got.lengths(rows))
        assert_same_batches(want, got, some_batches(len(want)))
    assert splits.train.num_rows > len(splits.train)  # the given negatives were converted too
    _assert_same_info(streamed.info, splits.info)
    assert streamed.info.load_tokenizer().sha256 == splits.info.tokenizer_sha256


def test_labelled_texts_and_features_read_back_as_the_file_rows(tmp_path):
    texts = load_texts(
        write_texts(tmp_path / "t.csv", labels=12), cache_dir=tmp_path / "cache", vocab_size=200
    )
    digits = load_digits()
    for name, splits in (("texts", texts), ("digits", digits)):
        convert_to_mds(splits, tmp_path / name, shard_size="16kb", compression=None)
        streamed = load_streaming(str(tmp_path / name), tmp_path / f"local-{name}")
        assert streamed.class_names == splits.class_names and streamed.name == splits.name
        if name == "texts":
            _assert_same_info(streamed.info, splits.info)
        for split in ("train", "test"):
            want, got = getattr(splits, split), getattr(streamed, split)
            assert torch.equal(want.labels, got.labels)
            assert_same_batches(want, got, some_batches(len(want)))
    assert streamed.train.feature_shape == digits.train.feature_shape
    assert torch.equal(
        streamed.test.features, digits.test.features
    )  # a whole split, as an evaluation embeds it


def _assert_same_info(streamed, loaded) -> None:
    """Every field of the data's ``TextInfo`` but this machine's copy (its paths) is the file's."""
    for field in dataclasses.fields(loaded):
        if field.name not in LOCAL_INFO:
            assert getattr(streamed, field.name) == getattr(loaded, field.name), field.name


def test_a_sampler_is_built_and_iterated_without_downloading_a_shard(tmp_path):
    convert_to_mds(pairs_splits(tmp_path), tmp_path / "mds", shard_size="4kb")
    streamed = load_streaming(str(tmp_path / "mds"), tmp_path / "local")
    sampler = PKBatchSampler(streamed.train.labels, classes_per_batch=4, samples_per_class=2, seed=0)
    batches = list(sampler)
    assert _shards(tmp_path / "local") == []  # the labels came from the manifest's rows
    assert_same_batches(pairs_splits(tmp_path / "again").train, streamed.train, batches[:1])
    rows = TextCollate(streamed.train)(batches[0])["index"].numpy()  # its pairs and their given negatives
    touched = {f"shard.{shard:05d}.mds" for shard in streamed.train.tokens.reader.shard_ids(rows).tolist()}
    assert _shards(tmp_path / "local" / "train") == sorted(touched)  # only the shards one batch touched


def test_the_manifest_records_counts_and_hashes(tmp_path):
    splits = pairs_splits(tmp_path)
    convert_to_mds(splits, tmp_path / "mds")
    manifest = json.loads((tmp_path / "mds" / "manifest.json").read_text())
    train = manifest["splits"]["train"]
    assert (train["rows"], train["sampled"], train["labels"]) == (
        splits.train.num_rows,
        len(splits.train),
        120,
    )
    assert train["rows_per_label"] == [2, 2] and manifest["info"]["max_length"] == 24
    assert len(manifest["sha256"]) == 64 and (tmp_path / "mds" / "tokenizer.json").is_file()
    with pytest.raises(FileExistsError, match="--overwrite"):
        convert_to_mds(splits, tmp_path / "mds")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda out: (out / "train" / "rows.npz").write_bytes(b"x"),
            r"train/rows.npz: its SHA-256 is not the manifest's",
        ),
        (lambda out: (out / "manifest.json").unlink(), r"manifest.json: no such file"),
        (lambda out: _edit_manifest(out, rows=1), r"manifest.json: its hash does not match its entries"),
        (lambda out: _edit_manifest(out, version=9), r"format version 9"),
    ],
)
def test_a_changed_or_incomplete_folder_is_one_line(tmp_path, damage, message):
    convert_to_mds(pairs_splits(tmp_path), tmp_path / "mds")
    damage(tmp_path / "mds")
    with pytest.raises(StreamingDataError, match=message) as caught:
        load_streaming(str(tmp_path / "mds"), tmp_path / "local", download_retry=0)
    assert "\n" not in str(caught.value)


def _edit_manifest(out: Path, rows: int | None = None, version: int | None = None) -> None:
    body = json.loads((out / "manifest.json").read_text())
    if rows is not None:
        body["splits"]["train"]["rows"] = rows
    if version is not None:
        body["version"] = version
        from composer_dynsample.data.streaming.manifest import manifest_digest

        body["sha256"] = manifest_digest(body)
    (out / "manifest.json").write_text(json.dumps(body))


def test_a_missing_shard_is_one_line_naming_it_and_the_attempts(tmp_path):
    convert_to_mds(pairs_splits(tmp_path), tmp_path / "mds", shard_size="4kb")
    missing = sorted((tmp_path / "mds" / "train").glob("shard.*"))[0]
    missing.unlink()
    streamed = load_streaming(str(tmp_path / "mds"), tmp_path / "local", download_retry=1)
    with pytest.raises(
        StreamingDataError, match=rf"train/{missing.name}: could not download it from .* after 2 attempts"
    ):
        streamed.train.pad(np.asarray([0, 1]))


def test_a_run_tokenizer_or_length_other_than_the_shards_is_refused(tmp_path):
    splits = pairs_splits(tmp_path)
    convert_to_mds(splits, tmp_path / "mds")
    other = pairs_splits(tmp_path / "other", vocab_size=150)
    with pytest.raises(StreamingDataError, match="tokenized by another tokenizer"):
        load_streaming(str(tmp_path / "mds"), tmp_path / "l1", tokenizer=str(other.info.tokenizer_path))
    with pytest.raises(StreamingDataError, match="max_length 24, the run asks for 32"):
        load_streaming(str(tmp_path / "mds"), tmp_path / "l2", max_length=32)
    same = load_streaming(
        str(tmp_path / "mds"), tmp_path / "l3", tokenizer=str(splits.info.tokenizer_path), max_length=24
    )
    assert len(same.train) == len(splits.train)


def test_a_cache_limit_below_four_shards_is_one_line(tmp_path):
    convert_to_mds(pairs_splits(tmp_path), tmp_path / "mds", shard_size="4kb", compression=None)
    with pytest.raises(StreamingDataError, match=r"train: .*[Cc]ache limit"):
        load_streaming(str(tmp_path / "mds"), tmp_path / "local", cache_limit="5kb")


@pytest.mark.parametrize("where", ["a file", "under a file", "not writable"])
def test_convert_into_a_path_it_cannot_write_is_one_line(tmp_path, capsys, monkeypatch, where):
    """Each of these ended in a traceback (NotADirectoryError, PermissionError) before."""
    import yaml

    from composer_dynsample.data.streaming import convert as module
    from tests.cli.helpers import one_line_error, pairs_data
    from tests.data.streaming.helpers import mined_pairs_config
    from tests.data.text.helpers import pair_rows, write_jsonl

    write_jsonl(tmp_path / "train.jsonl", pair_rows(40, seed=0))
    write_jsonl(tmp_path / "test.jsonl", pair_rows(8, seed=1))
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(mined_pairs_config(pairs_data(tmp_path), pairs_per_batch=8, workers=0)))
    (tmp_path / "afile").write_text("x")
    out = {
        "a file": tmp_path / "afile",
        "under a file": tmp_path / "afile" / "shards",
        "not writable": tmp_path / "ro" / "shards",
    }[where]
    if where == "not writable":  # root writes anywhere: the refusal of a read-only folder, as the OS gives it

        def refuse(splits, out, **options):
            Path(out).mkdir(parents=True)
            raise PermissionError(1, "Operation not permitted", str(out))

        monkeypatch.setattr(module, "convert_to_mds", refuse)
    error = one_line_error(capsys, ["convert", str(config), "--to", "mds", str(out)])
    expected = {"a file": "it is a file, not a folder", "under a file": "is a file, so no folder can be made under it",
                "not writable": "cannot write there: Operation not permitted"}[where]  # fmt: skip
    assert expected in error and str(out) in error
    assert not (tmp_path / "ro" / "shards").exists()  # nothing half-written left behind
    assert (tmp_path / "afile").read_text() == "x"  # an existing file is never replaced
