"""The shards served over HTTP as S3 serves them (moto's S3 server, started and stopped here): rows read by index
equal the file's, only the shards a batch touches are downloaded, and a missing shard, a corrupt shard or the
server gone mid-epoch is one line naming the shard's remote path and the attempts, never a hang."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from torch.utils.data import DataLoader

pytest.importorskip("streaming")
pytest.importorskip("moto")

import boto3
from moto.server import ThreadedMotoServer

from composer_dynsample.cli.main import one_line_message
from composer_dynsample.data import IndexDataset, TextCollate
from composer_dynsample.data.streaming import StreamingDataError, convert_to_mds, load_streaming
from composer_dynsample.samplers import PKBatchSampler
from tests.data.streaming.helpers import assert_same_batches, pairs_splits

pytestmark = pytest.mark.timeout(120)  # a hang is a failure, not a stuck suite
BUCKET, PREFIX = "shards", "pairs/v1"


@pytest.fixture
def store(tmp_path, monkeypatch):
    """``(server, s3 client, file splits, remote)``: the converted pairs uploaded to a running S3 server."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for key, value in {"S3_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": "1"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=BUCKET)
    splits = pairs_splits(tmp_path)
    out = convert_to_mds(splits, tmp_path / "mds", shard_size="4kb")
    for path in out.rglob("*"):
        if path.is_file():
            client.upload_file(str(path), BUCKET, f"{PREFIX}/{path.relative_to(out).as_posix()}")
    yield server, client, splits, f"s3://{BUCKET}/{PREFIX}"
    server.stop()


def _shard_keys(client, split="train"):
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=f"{PREFIX}/{split}/shard.")["Contents"]
    return sorted(item["Key"] for item in listed)


def test_rows_over_s3_are_the_file_rows_and_only_touched_shards_download(store, tmp_path):
    _, client, splits, remote = store
    streamed = load_streaming(remote, tmp_path / "local")
    assert not list((tmp_path / "local").rglob("shard.*"))  # manifest and rows only
    batch = next(
        iter(PKBatchSampler(streamed.train.labels, classes_per_batch=4, samples_per_class=2, seed=0))
    )
    assert_same_batches(splits.train, streamed.train, [batch])
    rows = TextCollate(streamed.train)(batch)["index"].numpy()
    touched = set(streamed.train.tokens.reader.shard_ids(rows).tolist())
    downloaded = list((tmp_path / "local" / "train").glob("shard.*"))
    assert len(downloaded) == len(touched) < len(_shard_keys(client))


def test_a_missing_shard_is_one_line_naming_it(store, tmp_path):
    _, client, _, remote = store
    key = _shard_keys(client)[0]
    client.delete_object(Bucket=BUCKET, Key=key)
    streamed = load_streaming(remote, tmp_path / "local", download_retry=1)
    with pytest.raises(StreamingDataError) as caught:
        streamed.train.pad(np.asarray([0, 1]))  # rows 0 and 1 live in the first shard
    assert str(caught.value).startswith(
        f"s3://{key.replace('pairs/v1', BUCKET + '/pairs/v1', 1)}: could not download"
    )
    assert "after 2 attempts" in str(caught.value) and "\n" not in str(caught.value)


def test_a_corrupt_shard_fails_its_hash_check_in_one_line(store, tmp_path):
    _, client, _, remote = store
    key = _shard_keys(client)[1]
    body = bytearray(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    client.put_object(Bucket=BUCKET, Key=key, Body=bytes(body))
    streamed = load_streaming(remote, tmp_path / "local")
    row = int(
        np.flatnonzero(streamed.train.tokens.reader.shard_ids(np.arange(streamed.train.num_rows)) == 1)[0]
    )
    with pytest.raises(
        StreamingDataError, match=r"shard\.00001\.mds\.zstd: its xxh3_64 hash is not the one"
    ) as caught:
        streamed.train.pad(np.asarray([row]))
    assert "\n" not in str(caught.value) and str(caught.value).startswith(f"s3://{BUCKET}/{PREFIX}/train/")
    with pytest.raises(
        StreamingDataError, match="hash is not the one"
    ):  # marked remote again: a retry fails, not waits
        streamed.train.pad(np.asarray([row]))


def test_the_server_gone_mid_epoch_ends_the_loader_in_one_line(store, tmp_path):
    server, _, _, remote = store
    streamed = load_streaming(remote, tmp_path / "local", download_retry=1, download_timeout=5)
    store_ = streamed.train
    shards = store_.tokens.reader.shard_ids(np.arange(len(store_)))
    later = np.flatnonzero(shards == shards[-1])[:4].tolist()  # sampled rows of the last shard
    assert shards[-1] != shards[0]
    store_.pad(np.asarray([0, 1]))  # the epoch's first batch's shard is in the cache ...
    server.stop()  # ... and then the server goes, before the workers start on the rest
    batches = iter(
        DataLoader(
            IndexDataset(store_.labels), batch_sampler=[[0, 1], later],
            collate_fn=TextCollate(store_, negatives=False), num_workers=2,
        )
    )  # fmt: skip
    next(batches)  # from the cache
    with pytest.raises(StreamingDataError) as caught:
        next(batches)
    line = one_line_message(caught.value)
    assert (
        line.startswith(f"s3://{BUCKET}/{PREFIX}/train/shard.{shards[-1]:05d}.mds.zstd: ")
        and "\n" not in line
    )
    assert f"could not download it from s3://{BUCKET}/{PREFIX} after 2 attempts" in line
