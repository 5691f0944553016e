"""``data: {name: mix}``: several data sets in one run, each batch from one source, labels never colliding,
each source scored on its own test split, errors naming the source."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from composer_dynsample.cli.main import main
from composer_dynsample.config import build_run, load_config
from composer_dynsample.config.components import ConfigError
from composer_dynsample.data.text.tokenizer import train_tokenizer
from tests.cli.helpers import BAG, one_line_error, write_run_config
from tests.common import IndexRecorder
from tests.data.text.helpers import pair_rows, write_jsonl, write_texts

PK = {"name": "pk", "classes_per_batch": 4, "samples_per_class": 2}
MINED = {"name": "mined_negatives", "pairs_per_batch": 4, "negatives_per_anchor": 1, "window": 2}
WARM_TABLE = {"embedding_table": {"warm_start": True}}


def _tokenizer(folder: Path) -> str:
    texts = [row[key] for row in pair_rows(64) for key in ("anchor", "positive")]
    path = folder / "tokenizer.json"
    train_tokenizer([*texts, "example intent"], vocab_size=200).save(str(path))
    return str(path)


def _sources(folder: Path, **extra: dict) -> dict:
    """Two pairs sources of different sizes (24 and 16 training pairs), one tokenizer, own caches."""
    tokenizer = _tokenizer(folder)
    sources = {}
    for name, (train, test, seed) in {"code": (24, 8, 0), "qa": (16, 6, 7)}.items():
        write_jsonl(folder / f"{name}.jsonl", pair_rows(train, seed=seed))
        write_jsonl(folder / f"{name}_test.jsonl", pair_rows(test, seed=seed + 100))
        sources[name] = {
            "name": "pairs",
            "path": str(folder / f"{name}.jsonl"),
            "test_path": str(folder / f"{name}_test.jsonl"),
            "cache_dir": str(folder / "cache" / name),
            "tokenizer": tokenizer,
            "max_length": 16 if name == "code" else 12,
            **extra.get(name, {}),
        }
    return sources


def _config(folder: Path, sources: dict, *, sampling: str = "proportional", **sections: object) -> str:
    model = {"normalize": True, "encoder": BAG, "loss": {"name": "info_nce", "temperature": 0.1}}
    return write_run_config(
        folder / "mix.yaml",
        data={"name": "mix", "sampling": sampling, "sources": sources},
        model=model,
        sampler=PK,
        ks=[1],
        max_duration="1ep",
        **sections,
    )


def test_a_mix_keeps_every_batch_in_one_source_with_its_own_labels_and_lengths(tmp_path):
    config = _config(tmp_path, _sources(tmp_path))
    run = build_run(load_config(config), tmp_path / "run")
    store, sampler = run.splits.train, run.train_dataloader.batch_sampler
    assert store.source_names == ("code", "qa") and store.row_starts.tolist() == [0, 48]
    code, qa = (run.splits.sources[name].train for name in ("code", "qa"))
    # labels shifted past the code source's (train and test: 32 pairs), never shared
    assert set(store.labels[:48].tolist()).isdisjoint(store.labels[48:].tolist())
    assert torch.equal(store.labels[48:], qa.labels + run.splits.sources["code"].num_classes)
    assert sampler.batch_counts == {"code": 6, "qa": 4}
    loader = run.train_dataloader
    seen = []
    for batch in loader:
        sources = {int(store.source_of_row[i]) for i in batch["index"].tolist()}
        assert len(sources) == 1
        source = sources.pop()
        own = (code, qa)[source]
        rows = batch["index"].numpy() - store.row_starts[source]
        ids, _ = own.pad(rows)  # the source's own tokens, at its own max_length
        assert np.array_equal(batch["features"]["input_ids"].numpy()[:, : ids.shape[1]], ids)
        assert batch["features"]["input_ids"].shape[1] <= (16, 12)[source]
        seen.append(source)
    assert sorted(seen) == [0] * 6 + [1] * 4


def test_a_mix_trains_and_scores_each_source_on_its_own_test_split(tmp_path, capsys):
    config = _config(tmp_path, _sources(tmp_path), sampling="round_robin")
    main(["train", config, "--run-dir", str(tmp_path / "run"), "evaluation.interval=2ba"])
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    final = metrics.get("final", metrics)
    sources = final["sources"]
    assert set(sources) == {"code", "qa"}
    assert sources["code"]["num_queries"] == 8 and sources["qa"]["num_queries"] == 6
    assert final["mrr"] == pytest.approx((sources["code"]["mrr"] + sources["qa"]["mrr"]) / 2)
    saved = OmegaConf.load(tmp_path / "run" / "config.yaml")
    assert saved.data.sources.qa.max_length == 12


def test_a_source_sampler_and_weight(tmp_path):
    sources = _sources(tmp_path, qa={"weight": 3, "sampler": {**PK, "classes_per_batch": 2}})
    run = build_run(load_config(_config(tmp_path, sources)), tmp_path / "run")
    sampler = run.train_dataloader.batch_sampler
    # 6 code batches of 4 pairs + 8 qa batches of 2 pairs = 14, split 1:3
    assert sampler.batch_counts == {"code": 4, "qa": 10}
    assert {len(batch) for batch in sampler} == {8, 4}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"qa": {"path": "missing.jsonl"}}, "data.sources.qa: "),
        ({"qa": {"max_lenght": 12}}, "data.sources.qa"),
        ({"qa": {"weight": 0}}, "data.sources.qa.weight must be a positive number"),
        ({"qa": {"sampler": {**PK, "classes_per_batch": 40}}}, "data.sources.qa: "),
        (
            {"qa": {"sampler": MINED}},
            "data.sources.qa: sampler: 'mined_negatives' takes its batches from the embedding",
        ),
    ],
)
def test_errors_name_the_source(tmp_path, capsys, change, message):
    config = _config(tmp_path, _sources(tmp_path, **change))
    error = one_line_error(capsys, ["train", config, "--run-dir", str(tmp_path / "run")])
    assert message in error


def test_sources_of_other_tokenizers_or_kinds_are_refused(tmp_path, capsys):
    sources = _sources(tmp_path)
    sources["qa"].pop("tokenizer")
    sources["qa"]["vocab_size"] = 120  # a tokenizer trained on the qa pairs alone
    error = one_line_error(capsys, ["train", _config(tmp_path, sources), "--run-dir", str(tmp_path / "r1")])
    assert "one model reads every source, so they take one tokenizer" in error
    sources = _sources(tmp_path)
    sources["labels"] = {
        "name": "texts",
        "path": str(write_texts(tmp_path / "texts.csv")),
        "tokenizer": sources["code"]["tokenizer"],
        "cache_dir": str(tmp_path / "cache" / "labels"),
    }
    config = _config(tmp_path, sources)
    error = one_line_error(
        capsys, ["train", config, "--run-dir", str(tmp_path / "r2"), "evaluation.interval=1ep"]
    )
    assert "the sources are scored by different protocols" in error and "evaluation.interval: null" in error


def test_a_pool_of_embeddings_across_sources_is_refused(tmp_path, capsys):
    from composer_dynsample.config.mix_data import check_mix_pools

    memory = {"hard_negative_mining": {"strategy": "batch_hard", "memory_size": 64}}
    config = _config(tmp_path, _sources(tmp_path), algorithms=memory)
    error = one_line_error(capsys, ["train", config, "--run-dir", str(tmp_path / "run")])
    assert "memory_size: a cross-batch memory would hold the rows of every source" in error
    cross = load_config(
        _config(tmp_path, _sources(tmp_path), algorithms={"hard_negative_mining": {"cross_rank": True}})
    )
    check_mix_pools(cross, world_size=1)  # one rank: nothing crosses
    with pytest.raises(ConfigError, match=r"set data\.batches_per_draw=4"):
        check_mix_pools(cross, world_size=4)
    OmegaConf.update(cross, "data.batches_per_draw", 8)
    check_mix_pools(cross, world_size=4)


def test_commands_of_one_data_set_refuse_a_mix_in_one_line(tmp_path, capsys):
    config = _config(tmp_path, _sources(tmp_path))
    main(["train", config, "--run-dir", str(tmp_path / "run"), "trainer.max_duration=1ba", "--quiet"])
    for argv, command in (
        (["convert", config, "--to", "mds", str(tmp_path / "shards")], "convert"),
        (["mine", config, "--out", str(tmp_path / "triplets.jsonl")], "mine"),
        (
            [
                "embed",
                "--run",
                str(tmp_path / "run"),
                "--input",
                str(tmp_path / "qa.jsonl"),
                "--out",
                str(tmp_path / "e.npz"),
            ],
            "embed --input",
        ),
    ):
        error = one_line_error(capsys, argv)
        assert (
            f"{command} takes one data set, and data is a mix of sources (code, qa); name one with --source"
            in error
        )
    assert not (tmp_path / "shards").exists() and not (tmp_path / "triplets.jsonl").exists()
    error = one_line_error(capsys, ["convert", config, "--to", "mds", str(tmp_path / "s"), "--source", "web"])
    assert "--source 'web': data.sources holds code, qa; name one of them" in error
    pairs = write_run_config(tmp_path / "one.yaml", data=_sources(tmp_path)["qa"], model={"encoder": BAG},
                             sampler=PK, ks=[1], max_duration="1ba")  # fmt: skip
    error = one_line_error(capsys, ["convert", pairs, "--to", "mds", str(tmp_path / "s"), "--source", "qa"])
    assert "data is one data set, not a mix of sources; leave --source out" in error


def test_eval_embed_and_export_of_a_mix_run(tmp_path):
    config = _config(tmp_path, _sources(tmp_path))
    run_dir = tmp_path / "run"
    main(["train", config, "--run-dir", str(run_dir), "trainer.max_duration=3ba", "--quiet"])
    main(["eval", "--run", str(run_dir), "--out", str(tmp_path / "eval.json")])
    trained = json.loads((run_dir / "metrics.json").read_text())["sources"]
    assert (
        json.loads((tmp_path / "eval.json").read_text())["sources"] == trained
    )  # the same weights, scored apart
    main(["embed", "--run", str(run_dir), "--split", "test", "--out", str(tmp_path / "test.npz")])
    with np.load(tmp_path / "test.npz") as arrays:
        assert arrays["embeddings"].shape[0] == 2 * (8 + 6)  # both sources' test rows
        assert len(set(arrays["labels"][:16].tolist()) & set(arrays["labels"][16:].tolist())) == 0
    main(["export", "--run", str(run_dir), "--out", str(tmp_path / "model"), "--format", "huggingface"])
    assert (tmp_path / "model" / "encoder_state.pt").is_file()


def test_each_source_converted_with_source_trains_the_mix_from_shards(tmp_path):
    pytest.importorskip("streaming")
    sources = _sources(tmp_path)
    config = _config(tmp_path, sources)
    for name in sources:
        main(["convert", config, "--source", name, "--to", "mds", str(tmp_path / "shards" / name)])
    streamed = {
        name: {
            "name": "streaming",
            "remote": str(tmp_path / "shards" / name),
            "local": str(tmp_path / "cache" / f"s-{name}"),
        }
        for name in sources
    }
    from_files = build_run(load_config(config), tmp_path / "files")
    from_shards = build_run(load_config(_config(tmp_path, streamed)), tmp_path / "shards_run")
    for built in (from_files, from_shards):
        built.trainer.close()
    assert from_shards.splits.train.source_names == ("code", "qa")
    assert torch.equal(from_shards.splits.train.labels, from_files.splits.train.labels)
    first, second = (list(run.train_dataloader.batch_sampler) for run in (from_files, from_shards))
    assert first == second  # the same batches, each from one source
    trained = tmp_path / "trained"
    main(["train", config, "--run-dir", str(trained), "trainer.max_duration=1ba", "--quiet"])
    embedded = tmp_path / "qa.npz"
    main(["embed", "--run", str(trained), "--source", "qa", "--split", "test", "--out", str(embedded)])
    with np.load(embedded) as arrays:
        assert arrays["embeddings"].shape[0] == 2 * 6  # the qa source's test pairs only


def test_a_loss_per_source_scores_each_batch_with_its_sources_loss(tmp_path):
    from composer_dynsample.losses import InfoNCELoss, PerSourceLoss, TripletMarginLoss

    triplet = {"name": "triplet_margin", "margin": 0.3}
    sources = _sources(tmp_path, qa={"loss": triplet})
    run = build_run(load_config(_config(tmp_path, sources)), tmp_path / "run")
    loss = run.model.loss_fn
    assert isinstance(loss, PerSourceLoss) and set(loss.losses) == {"code", "qa"}
    assert isinstance(loss.losses["code"], InfoNCELoss) and loss.losses["qa"].margin == 0.3
    references = {"code": InfoNCELoss(temperature=0.1), "qa": TripletMarginLoss(margin=0.3)}
    seen = set()
    for batch in run.train_dataloader:
        source = batch["source"]  # the collate names the batch's one source
        embeddings = run.model(batch)
        expected = references[source](embeddings, batch["labels"])
        assert torch.allclose(run.model.loss(embeddings, batch), expected), source
        seen.add(source)
    assert seen == {"code", "qa"}
    run.trainer.close()
    bad = _sources(tmp_path, qa={"loss": {"name": "triplet_margin", "margn": 0.3}})
    with pytest.raises(ConfigError, match=r"data\.sources\.qa: .*margn"):
        build_run(load_config(_config(tmp_path, bad)), tmp_path / "bad")


def test_given_negatives_stay_in_their_anchors_source(tmp_path):
    sources = _sources(tmp_path)
    for name, seed in (("code", 0), ("qa", 7)):  # given negatives in both training files
        write_jsonl(
            tmp_path / f"{name}.jsonl", pair_rows(24 if name == "code" else 16, seed=seed, negatives=True)
        )
    run = build_run(load_config(_config(tmp_path, sources)), tmp_path / "run")
    store = run.splits.train
    for batch in run.train_dataloader:
        rows = batch["index"].numpy()
        assert len(rows) > 8  # the anchors' given negatives joined the batch
        assert len(set(store.row_sources[rows].tolist())) == 1  # sampled rows and negatives: one source
        own = run.splits.sources[batch["source"]].train
        start = int(store.row_starts[store.source_names.index(batch["source"])])
        sampled = rows[rows < len(store)] - start
        expected = own.negatives_of(sampled)
        ids, _ = own.pad(expected)
        assert batch["features"]["input_ids"].shape[0] == len(sampled) + len(expected)
        negatives = batch["features"]["input_ids"][len(sampled) :, : ids.shape[1]].numpy()
        assert (negatives == ids).all()  # the source's own negatives of these anchors, in order
    run.trainer.close()


def _fit(config: str, run_dir: Path, **trainer: object) -> tuple[object, IndexRecorder]:
    """Build and train the run of ``config`` with these ``trainer`` keys, recording every batch's rows."""
    cfg = load_config(config)
    for key, value in trainer.items():
        OmegaConf.update(cfg, f"trainer.{key}", value)
    recorder = IndexRecorder()
    run = build_run(cfg, run_dir, callbacks=[recorder])
    run.trainer.fit()
    run.trainer.close()
    return run, recorder


def test_sources_draw_from_their_own_rows_of_the_warm_table_and_a_mid_epoch_resume_continues(tmp_path):
    hard = {"code": {"sampler": {**PK, "name": "hard_class_pk"}}, "qa": {"sampler": MINED}}
    config = _config(tmp_path, _sources(tmp_path, **hard), algorithms=WARM_TABLE)
    run, full = _fit(config, tmp_path / "full", save_interval="3ba")
    store, sampler = run.splits.train, run.train_dataloader.batch_sampler
    mined = sampler.samplers["qa"]
    assert mined.guard_counts(0)["no_embedding"] == 0  # every anchor of epoch 0 ranked by the warm table
    assert sampler.samplers["code"].snapshot_fingerprint() != ""  # the code source's class centroids
    qa_start = int(store.row_starts[1])
    for batch in full.epoch(0):
        rows = np.asarray(batch)
        assert len(set(store.source_of_row[rows].tolist())) == 1  # negatives too: one source a batch
        if store.source_of_row[rows[0]] == 1:  # 4 pairs, then each anchor's mined negative
            negatives, pairs = rows[8:], rows[:8]
            assert len(rows) == 12 and not store.is_query[negatives].any()
            assert set(store.labels[negatives].tolist()).isdisjoint(store.labels[pairs].tolist())
            assert mined.is_passage[negatives - qa_start].all()
    checkpoint = tmp_path / "full" / "checkpoints" / "ep0-ba3-rank0.pt"
    _, resumed = _fit(config, tmp_path / "resumed", load_path=str(checkpoint))
    assert resumed.epoch(0) == full.epoch(0)[3:]  # the same batches, the mined negatives too
    refreshing = _sources(tmp_path, qa={"sampler": {**MINED, "refresh_every": 2}})
    with pytest.raises(ConfigError, match=r"data\.sources\.qa\.sampler: .*\(refresh_every=\.\.\.\)"):
        build_run(load_config(_config(tmp_path, refreshing, algorithms=WARM_TABLE)), tmp_path / "refused")
