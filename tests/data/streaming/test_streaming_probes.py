"""``data: {name: streaming}`` where a run meets another run, a small cache, workers, Ctrl-C, prompts and ``mine``.

One ``local`` folder is one run's cache at a time (the ranks of one job share it); a second run, of the
same remote or another, is refused in one line before anything in the folder changes, and the folder
serves the next run afterwards. A ``cache_limit`` below four shards is one line naming the least it may
be; at that least, batches touching more shards than the cache holds read the file's rows. A corrupt
shard read by DataLoader workers, Ctrl-C and its resume, prompts and ``mine`` behave as on the file or
are one line naming what to do.
"""

from __future__ import annotations

import gc
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

pytest.importorskip("streaming")

from composer_dynsample.cli.commands import train
from composer_dynsample.data.streaming import (
    StreamingDataError,
    close_readers,
    convert_to_mds,
    load_streaming,
)
from composer_dynsample.data.streaming.cache_owner import claim_cache
from tests.cli.helpers import one_line_error, pairs_data
from tests.data.streaming.helpers import (
    assert_same_batches,
    mined_pairs_config,
    pairs_splits,
    run_weights,
    some_batches,
    timeless,
)

ROOT = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
PROMPTS = {"anchor": "query: ", "positive": "passage: "}

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(autouse=True)
def _forget_readers():
    yield
    close_readers()
    gc.collect()


def _assert_same_rows(splits, streamed) -> None:
    for want, got in ((splits.train, streamed.train), (splits.test, streamed.test)):
        assert torch.equal(want.labels, got.labels)  # the same rows, labels and ids
        assert_same_batches(want, got, some_batches(len(want), count=2))


def _cached(local: Path) -> list[str]:
    return sorted(path.name for path in (local / "train").glob("shard.*"))


@pytest.fixture
def two_remotes(tmp_path):
    """``((file splits, converted folder), (other file splits, its folder))``: two data sets, shards of 2 kB."""
    first = pairs_splits(tmp_path / "a", count=40)
    second = pairs_splits(tmp_path / "b", count=40, max_length=16)
    return (
        (first, convert_to_mds(first, tmp_path / "mds-a", shard_size="2kb")),
        (second, convert_to_mds(second, tmp_path / "mds-b", shard_size="2kb")),
    )


HOLDER = """
import sys
import numpy as np
from composer_dynsample.data.streaming import load_streaming
streamed = load_streaming(sys.argv[1], sys.argv[2])
rows = np.arange(len(streamed.train))
before = streamed.train.pad(rows)[0]
print("ready", flush=True)
sys.stdin.readline()
print("same" if np.array_equal(before, streamed.train.pad(rows)[0]) else "changed", flush=True)
"""


def test_a_cache_in_use_by_another_run_is_refused_before_it_changes(two_remotes, tmp_path):
    """A second run on a busy ``local``: of another remote it removed the first run's shards and read rows of
    both conversions, of the same remote it was a Streaming message about shared memory, or no error."""
    (first, out_a), (second, out_b) = two_remotes
    local = tmp_path / "local"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(out_a), str(local)],
        cwd=ROOT, env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "ready", holder.stderr.read()
        cached, marker = _cached(local), (local / "shards.sha256").read_text()
        for remote in (out_a, out_b):
            with pytest.raises(StreamingDataError) as caught:
                load_streaming(str(remote), local)
            message = str(caught.value)
            assert message.startswith(
                f"data.local {str(local)!r} is the cache of another run now (pid {holder.pid} "
            )
            assert f"reading {out_a}" in message and "give this run another data.local" in message
            assert "\n" not in message
        assert _cached(local) == cached and (local / "shards.sha256").read_text() == marker
        out, err = holder.communicate("\n", timeout=60)
        assert holder.returncode == 0 and out.split() == ["same"], err
    finally:
        if holder.poll() is None:
            holder.kill()
    _assert_same_rows(second, load_streaming(str(out_b), local))  # the run ended: the folder is free
    close_readers()
    gc.collect()
    _assert_same_rows(first, load_streaming(str(out_a), local))  # and back, one after the other


def test_one_process_reading_a_remote_keeps_its_cache_from_another(two_remotes, tmp_path):
    """The second load removed the shards the first one's reader reads before it was refused."""
    (first, out_a), (_, out_b) = two_remotes
    local = tmp_path / "local"
    streamed = load_streaming(str(out_a), local)
    streamed.train.pad(np.arange(len(first.train)))
    cached = _cached(local)
    with pytest.raises(StreamingDataError, match=r"this process already caches .*mds-a there; give .*mds-b"):
        load_streaming(str(out_b), local)
    assert _cached(local) == cached and len(cached) > 2
    _assert_same_rows(first, streamed)
    close_readers()  # forgotten: the folder may be opened again, as the error of another conversion says
    _assert_same_rows(first, load_streaming(str(out_a), local))


CLAIM = """
import sys
from pathlib import Path
from composer_dynsample.data.streaming.cache_owner import claim_cache
claim_cache(Path(sys.argv[1]), "remote")
print("held", flush=True)
sys.stdin.readline()
"""


def test_the_ranks_of_one_job_share_a_cache_and_another_job_is_refused(tmp_path, monkeypatch):
    local = tmp_path / "local"
    local.mkdir()
    rank = {"WORLD_SIZE": "2", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
    other = subprocess.Popen(
        [sys.executable, "-c", CLAIM, str(local)],
        cwd=ROOT, env={**ENV, **rank}, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert other.stdout.readline().strip() == "held"
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("MASTER_ADDR", "node0")
        monkeypatch.setenv("MASTER_PORT", "29501")  # another job on the node
        with pytest.raises(StreamingDataError, match="is the cache of another run now"):
            claim_cache(local, "remote")
        monkeypatch.setenv("MASTER_PORT", "29500")  # the job's second rank
        claim_cache(local, "remote")
    finally:
        other.communicate("\n", timeout=60)


def test_a_cache_limit_below_four_shards_names_the_least_and_the_least_reads_every_batch(tmp_path, capsys):
    splits = pairs_splits(tmp_path, count=40)
    out = convert_to_mds(splits, tmp_path / "mds", shard_size="2kb")
    with pytest.raises(StreamingDataError) as caught:
        load_streaming(str(out), tmp_path / "local", cache_limit=4096)
    message = str(caught.value)
    found = re.search(r"data\.cache_limit 4096 \(4096 bytes\) is below .* give at least (\d+) bytes", message)
    assert found and "\n" not in message, message
    least = int(found.group(1))
    largest = max(
        shard["raw_data"]["bytes"] + shard["zip_data"]["bytes"]
        for split in ("train", "test")
        for shard in json.loads((out / split / "index.json").read_text())["shards"]
    )
    assert least == 4 * largest
    with pytest.raises(StreamingDataError, match=f"give at least {least} bytes"):
        load_streaming(str(out), tmp_path / "local", cache_limit=least - 1)
    streamed = load_streaming(str(out), tmp_path / "local", cache_limit=least)
    assert len(list((out / "train").glob("shard.*"))) > 4  # one batch of every row needs more than fit
    everything = [np.random.default_rng(seed).permutation(len(splits.train)).tolist() for seed in range(3)]
    assert_same_batches(splits.train, streamed.train, everything)
    close_readers()
    data = {"name": "streaming", "remote": str(out), "local": str(tmp_path / "cli"), "cache_limit": "5kb"}
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(mined_pairs_config(data, pairs_per_batch=8, workers=0, max_duration="1ba"))
    )
    error = one_line_error(capsys, ["train", str(config), "--run-dir", str(tmp_path / "run")])
    assert (
        f"data.cache_limit '5kb' (5120 bytes) is below the cache limit its shards need: give at least {least}"
        in error
    )


def _train_process(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "composer_dynsample", "train", *args]
    return subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)


def _tool_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("composer-dynsample")]


@pytest.fixture
def on_shards(tmp_path):
    """``(file data section, streaming data section)``: 40 pairs in ``tmp_path`` and their shards of 2 kB."""
    splits = pairs_splits(tmp_path, count=40)
    convert_to_mds(splits, tmp_path / "mds", shard_size="2kb")
    return pairs_data(tmp_path), {
        "name": "streaming",
        "remote": str(tmp_path / "mds"),
        "local": str(tmp_path / "cache"),
    }


def test_a_corrupt_shard_under_dataloader_workers_is_one_line_and_exit_2(on_shards, tmp_path):
    _, streaming = on_shards
    shard = sorted((tmp_path / "mds" / "train").glob("shard.*"))[1]
    data = bytearray(shard.read_bytes())
    data[-8:] = bytes(255 - b for b in data[-8:])
    shard.write_bytes(bytes(data))
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(mined_pairs_config(streaming, pairs_per_batch=8, workers=2, max_duration="1ep"))
    )
    done = _train_process(str(config), "--quiet", "--run-dir", str(tmp_path / "run"))
    lines = _tool_lines(done.stderr)
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert lines[0] == (
        f"composer-dynsample train: error: {shard}: its xxh3_64 hash is not the one index.json records; the shard "
        "is corrupt (upload it again from the converted folder)."
    )
    assert "Traceback" not in done.stderr


def test_ctrl_c_on_shards_resumes_with_the_printed_command_to_the_uninterrupted_run(on_shards, tmp_path):
    """SIGINT after batch 3 of 10 with two DataLoader workers: exit 130, one line; its command trains batches
    4-10 and ends with the weights and metrics of the run never interrupted."""
    _, streaming = on_shards
    config = tmp_path / "c.yaml"
    body = {**mined_pairs_config(streaming, pairs_per_batch=8, workers=2, max_duration="2ep"), "seed": 0}
    config.write_text(yaml.safe_dump(body))
    reference = train(
        {**body, "data": {**streaming, "local": str(tmp_path / "cache-reference")}},
        run_dir=tmp_path / "reference",
    )  # its readers live on in this process: another run takes another cache
    signal_at = "callbacks.signal_at={_component_: tests.cli.test_interrupt.SignalAt, batch: 3}"
    run_dir = tmp_path / "run"
    interrupted = _train_process(str(config), "--quiet", signal_at, "--run-dir", str(run_dir))
    lines = _tool_lines(interrupted.stderr)
    assert interrupted.returncode == 130 and len(lines) == 1, interrupted.stderr[-3000:]
    assert lines[0].startswith("composer-dynsample train: interrupted by SIGINT after 3 batches"), lines[0]
    command = shlex.split(lines[0].split("resume with: ", 1)[1])
    resumed = _train_process(*command[2:])  # the printed command as it is, after "composer-dynsample train"
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert (metrics["resumed_from_batch"], metrics["batches"]) == (3, reference["batches"]) == (3, 10)
    for key in ("mrr", "recall_at_1", "ndcg_at_10", "embedding_table"):
        assert timeless(metrics[key]) == timeless(reference[key]), key
    want, got = run_weights(tmp_path / "reference"), run_weights(run_dir)
    assert want.keys() == got.keys() and all(torch.equal(want[name], got[name]) for name in want)


def test_prompts_travel_in_the_shards_and_a_prompt_key_is_one_line(tmp_path, capsys):
    """Converted from a prompted file, the shards hold the prompted ids; ``data.prompts`` or
    ``data.prompt_names`` on the shards names the key (they are the convert's)."""
    splits = pairs_splits(tmp_path, count=40, prompts=PROMPTS)
    plain = pairs_splits(tmp_path / "plain", count=40)
    assert not np.array_equal(splits.train.pad(np.arange(8))[0], plain.train.pad(np.arange(8))[0])
    out = convert_to_mds(splits, tmp_path / "mds", shard_size="2kb")
    streamed = load_streaming(str(out), tmp_path / "local")
    _assert_same_rows(splits, streamed)
    assert streamed.info.prompts == PROMPTS
    assert np.array_equal(streamed.train.prompt_lengths, splits.train.prompt_lengths)
    close_readers()
    for key, value in (("prompts", PROMPTS), ("prompt_names", "query")):
        data = {"name": "streaming", "remote": str(out), "local": str(tmp_path / "cli"), key: value}
        config = tmp_path / f"{key}.yaml"
        config.write_text(
            yaml.safe_dump(mined_pairs_config(data, pairs_per_batch=8, workers=0, max_duration="1ba"))
        )
        error = one_line_error(capsys, ["train", str(config), "--run-dir", str(tmp_path / "run")])
        assert f"data: unknown key {key!r} for 'streaming'" in error


def test_mine_on_a_streaming_config_is_one_line_naming_a_pairs_config(on_shards, tmp_path, capsys):
    _, streaming = on_shards
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(mined_pairs_config(streaming, pairs_per_batch=8, workers=0)))
    error = one_line_error(capsys, ["mine", str(config), "--out", str(tmp_path / "negatives.jsonl")])
    assert "this config's data are 'streaming'; use a pairs config" in error
    assert not (tmp_path / "negatives.jsonl").exists()
