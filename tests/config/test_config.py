"""The YAML config: every recipe in yamls/ builds (and takes a step), keys are checked, overrides apply."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from composer_dynsample import DistributedBatchSampler, HardNegativeMining, SetSamplerEpoch
from composer_dynsample.config import ConfigError, build_run, load_config, save_config
from composer_dynsample.models.encoders import Conv1dEncoder, Conv2dEncoder, MLPEncoder
from composer_dynsample.models.text import BagOfTokensEncoder, TransformerEncoder
from composer_dynsample.schedulers import OneCycleScheduler

YAMLS = sorted((Path(__file__).resolve().parents[2] / "yamls").glob("*.yaml"))
DIGITS = next(path for path in YAMLS if path.name == "digits_quick.yaml")
QUIET = ["trainer.progress_bar=false"]

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def build(tmp_path, *overrides, config=DIGITS):
    return build_run(load_config(config, [*QUIET, *overrides]), tmp_path / "run")


def test_the_expected_recipes_exist():
    names = {path.name for path in YAMLS}
    assert {
        "mnist1d_default.yaml",
        "digits_quick.yaml",
        "mnist1d_two_ranks.yaml",
        "mnist1d_batch_hard.yaml",
        "mnist1d_random_triplets.yaml",
    } <= names


# The code-search recipes read a few standard-library packages here, not the whole installed Python.
_CODE_SEARCH = [
    "data.groups=[stdlib:json,stdlib:csv,stdlib:email,stdlib:http,stdlib:logging]",
    "data.max_pairs_per_group=40",
    "data.test_fraction=0.3",
    "data.vocab_size=500",
    "sampler.classes_per_batch=8",
]
CHEAP = {"code_search": _CODE_SEARCH, "code_search_transformer": _CODE_SEARCH}


def _finetune_overrides(tmp_path: Path) -> list[str]:
    """A tiny sentence-transformers folder and pairs of its words for the fine-tuning recipe."""
    from tests.data.text.helpers import pair_rows, write_jsonl
    from tests.models.folders import save_sentence_folder

    folder = save_sentence_folder(tmp_path / "model", pooling="mean", max_seq_length=24)
    write_jsonl(tmp_path / "train.jsonl", pair_rows(32, seed=0))
    write_jsonl(tmp_path / "test.jsonl", pair_rows(12, seed=1))
    # The recipe's max_length (128) carries over to a pairs section: the tiny folder's 24 positions say less.
    data = f"{{name: pairs, path: {tmp_path / 'train.jsonl'}, test_path: {tmp_path / 'test.jsonl'}, max_length: 24}}"
    return [f"model.encoder.path={folder}", f"data={data}", "sampler.classes_per_batch=8"]


def _mix_overrides(tmp_path: Path) -> list[str]:
    """The mix recipe's two sources on a few standard-library packages each, its tokenizer under tmp_path."""
    groups = {
        "science": "stdlib:json,stdlib:csv,stdlib:email,stdlib:http,stdlib:logging",
        "web": "stdlib:urllib,stdlib:xml,stdlib:asyncio,stdlib:unittest,stdlib:importlib",
    }
    tokenizer = str(tmp_path / "tokenizer.json")
    return [
        *(f"data.sources.{name}.groups=[{packages}]" for name, packages in groups.items()),
        *(f"data.sources.{name}.max_pairs_per_group=40" for name in groups),
        "data.sources.science.vocab_size=500",
        f"data.sources.science.save_tokenizer={tokenizer}",
        f"data.sources.web.tokenizer={tokenizer}",
        "sampler.classes_per_batch=8",
    ]


@pytest.mark.parametrize("config", YAMLS, ids=[path.stem for path in YAMLS])
def test_every_recipe_builds_and_trains_one_batch(config, tmp_path):
    overrides = CHEAP.get(config.stem, [])
    if config.stem == "finetune_code_search":
        overrides = _finetune_overrides(tmp_path)
    if config.stem == "mix_code_search":  # each source a few standard-library packages, the tokenizer in tmp
        overrides = _mix_overrides(tmp_path)
    run = build(tmp_path, "trainer.max_duration=1ba", "evaluation.interval=null", *overrides, config=config)
    assert isinstance(
        run.model.encoder,
        (Conv1dEncoder, Conv2dEncoder, MLPEncoder, BagOfTokensEncoder, TransformerEncoder),
    )
    assert isinstance(run.train_dataloader.batch_sampler, DistributedBatchSampler)
    assert any(isinstance(cb, SetSamplerEpoch) for cb in run.trainer.state.callbacks)
    run.trainer.fit()
    assert int(run.trainer.state.timestamp.batch) == 1
    assert torch.isfinite(run.trainer.state.loss).all()


def test_the_default_recipe_is_the_documented_one(tmp_path):
    cfg = load_config(next(path for path in YAMLS if path.name == "mnist1d_default.yaml"))
    assert cfg.algorithms.hard_negative_mining.strategy == {"0ep": "semi_hard", "40ep": "batch_hard"}
    assert cfg.sampler.classes_per_batch * cfg.sampler.samples_per_class == 128
    assert (cfg.optimizer.name, cfg.scheduler.name, cfg.trainer.max_duration) == (
        "adamw",
        "one_cycle",
        "60ep",
    )
    run = build_run(load_config(cfg, QUIET), tmp_path)
    (mining,) = [a for a in run.trainer.state.algorithms if isinstance(a, HardNegativeMining)]
    assert [name for _, name in mining.schedule] == ["semi_hard", "batch_hard"]
    assert run.gallery is not None and run.ks == (1, 5)


def test_dotted_overrides_reach_the_built_objects(tmp_path):
    run = build(
        tmp_path,
        "seed=7",
        "sampler.classes_per_batch=5",
        "sampler.samples_per_class=4",
        "model.encoder.embedding_dim=12",
        "model.encoder.hidden_dims=[16,16]",
        "optimizer.lr=0.01",
        "trainer.max_duration=3ep",
        "evaluation.ks=[1,3]",
        "algorithms.hard_negative_mining.strategy=batch_hard",
    )
    sampler = run.train_dataloader.batch_sampler
    assert (sampler.classes_per_batch, sampler.samples_per_class, sampler.seed) == (5, 4, 7)
    assert run.train_dataloader.batch_size == 20
    assert run.model.encoder.embedding_dim == 12 and run.seed == 7
    assert [m.out_features for m in run.model.encoder.layers if isinstance(m, torch.nn.Linear)] == [
        16,
        16,
        12,
    ]
    assert run.trainer.state.optimizers[0].defaults["lr"] == pytest.approx(0.01)
    assert str(run.trainer.state.max_duration) == "3ep"
    assert sorted(run.model.eval_metrics) == ["map_at_r", "r_precision", "recall_at_1", "recall_at_3"]
    (mining,) = [a for a in run.trainer.state.algorithms if isinstance(a, HardNegativeMining)]
    assert mining.schedule[0][1] == "batch_hard"


def test_null_turns_entries_and_sections_off(tmp_path):
    run = build(
        tmp_path, "algorithms.hard_negative_mining=null", "scheduler=null", "evaluation.interval=null"
    )
    assert not any(isinstance(a, HardNegativeMining) for a in run.trainer.state.algorithms)
    assert run.gallery is None and run.trainer.state.evaluators == []


def test_config_round_trips_through_save(tmp_path):
    cfg = load_config(DIGITS, ["optimizer.lr=0.5"])
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == cfg
    assert OmegaConf.load(tmp_path / "config.yaml").optimizer.lr == 0.5


@pytest.mark.parametrize(
    ("override", "key", "a_valid_key"),
    [
        ("sede=1", "sede", "seed"),
        ("data.cache=1", "cache", "test_fraction"),
        ("model.normalise=true", "normalise", "normalize"),
        ("model.encoder.hidden=[8]", "hidden", "hidden_dims"),
        ("model.loss.margn=0.1", "margn", "margin"),
        ("sampler.p=4", "p", "classes_per_batch"),
        ("sampler.labels=[1]", "labels", "samples_per_class"),
        ("dataloader.workers=2", "workers", "num_workers"),
        ("algorithms.hard_negative_mining.stratgy=batch_hard", "stratgy", "strategy"),
        ("callbacks.set_sampler_epoch.check=false", "check", "check_ranks"),
        ("optimizer.learning_rate=0.1", "learning_rate", "weight_decay"),
        ("optimizer.params=0", "params", "lr"),
        ("scheduler.warmup=0.1", "warmup", "pct_start"),
        ("evaluation.every=2ep", "every", "interval"),
        ("trainer.max_epochs=3", "max_epochs", "max_duration"),
        ("loggers.file.name=x", "name", "filename"),
    ],
)
def test_unknown_keys_name_the_key_and_the_valid_ones(tmp_path, override, key, a_valid_key):
    with pytest.raises(ConfigError, match="unknown key") as error:
        build(tmp_path, override)
    message = str(error.value)
    assert repr(key) in message and "valid keys" in message and a_valid_key in message


@pytest.mark.parametrize(
    ("override", "registry_entry"),
    [
        ("algorithms.mixup={}", "hard_negative_mining"),
        ("callbacks.early_stop={}", "set_sampler_epoch"),
        ("loggers.neptune={}", "in_memory"),
        ("model.encoder.name=resnet", "conv1d"),
        ("model.loss.name=arcface", "triplet_margin"),
        ("optimizer.name=lamb", "adamw"),
        ("scheduler.name=cyclic", "one_cycle"),
        ("sampler.name=random", "two_stream"),
        ("data.name=cifar", "mnist1d"),
    ],
)
def test_unknown_names_list_the_registry(tmp_path, override, registry_entry):
    with pytest.raises(ConfigError, match=r"unknown name .*valid names") as error:
        build(tmp_path, override)
    assert registry_entry in str(error.value)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["optimizer.lr=-1"], r"optimizer: AdamW\(lr=-1.*rejected the config: Invalid learning rate"),
        (["sampler.classes_per_batch=1"], r"sampler: PKBatchSampler\(classes_per_batch=1.*rejected"),
        (["sampler.samples_per_class=500"], r"sampler: PKBatchSampler\(.*samples_per_class=500"),
        (["model.encoder.hidden_dims=[0]"], r"model.encoder: MLPEncoder\(.*hidden_dims\[0\] must be"),
        (["model.encoder.name=conv1d"], "model.encoder: unknown key 'hidden_dims' for 'conv1d'"),
        (["model.loss.margin=abc"], r"model.loss.margin must be a number, got 'abc' \(a string\)"),
        (["algorithms.hard_negative_mining.strategy=hardest"], "strategy must be one of"),
        (["trainer.max_duration=abc"], "trainer.max_duration must be a Composer time string"),
        (["trainer.max_duration=null"], "trainer.max_duration is required"),
        (["trainer.load_path=/no/such/checkpoint.pt"], "trainer.load_path '/no/such/checkpoint.pt' does not"),
        (["trainer.optimizers=x"], "set by the 'optimizer' section"),
        (["evaluation.ks=[0,5]"], r"evaluation.ks must be a list of distinct integers >= 1, got \[0, 5\]"),
        (["evaluation.interval=often"], "evaluation.interval must be a Composer time string"),
        (["evaluation.distance=manhattan"], "evaluation.distance must be 'cosine' or 'euclidean'"),
        (["seed=-3"], r"seed must be an integer in \[0, 4294967295\], got -3"),
        # numpy's seed range; a larger seed crashed in Composer's seed_all.
        (["seed=4294967296"], r"seed must be an integer in \[0, 4294967295\], got 4294967296"),
        # Zero trained nothing (and blamed the checkpoint) or silently turned evaluation off.
        (["trainer.max_duration=0ep"], "trainer.max_duration must be greater than zero, got '0ep'"),
        (["trainer.max_duration=0ba"], "trainer.max_duration must be greater than zero, got '0ba'"),
        (["evaluation.interval=0ba"], r"evaluation.interval must be greater than zero, got '0ba' \(null"),
        (["evaluation.interval=0"], "evaluation.interval must be greater than zero, got '0ep'"),
        # AdamW indexes betas[1]: its IndexError is one line naming the section, not a traceback.
        (
            ["optimizer.betas=[0.9]"],
            r"optimizer: AdamW\(.*betas=\(0\.9,\)\) rejected the config: tuple index",
        ),
        (["dataloader.num_workers=-1"], "dataloader.num_workers must be an integer >= 0"),
        (["data.name=file"], "data: 'file' needs the key 'path'"),
        (["data.name=file", "data.path=/no/such.npz"], r"data: .*no such file"),
        (["callbacks.set_sampler_epoch=3"], "callbacks.set_sampler_epoch must be a mapping"),
        (["scheduler.pct_start=1.5"], r"scheduler: OneCycleScheduler\(pct_start=1.5\).*pct_start must be"),
        (["sampler=null"], "no 'sampler' section"),
        (["model.encoder=null"], "model needs an 'encoder'"),
        # P x 1 batches hold no positive pair: every step mined nothing and the run trained nothing.
        (["sampler.samples_per_class=1"], r"sampler: PKBatchSampler\(.*samples_per_class=1 gives batches"),
        # Beyond every class: "use classes_per_batch in [2, 0]".
        (
            [f"sampler.samples_per_class={2**62}"],
            rf"samples_per_class must be an integer in \[2, 1438\], got {2**62}\.$",
        ),
        (
            ["model.loss.margin=-1"],
            r"model.loss: TripletMarginLoss\(margin=-1\) .*margin must be a number >= 0",
        ),
        (
            ["algorithms.hard_negative_mining.strategy=semihard"],
            r"got 'semihard'\. Did you mean 'semi_hard'\?$",
        ),
        # Recall@2000 of a 1438-item gallery counted every query a hit.
        (
            ["evaluation.ks=[1,2000]"],
            r"^evaluation.ks=\[1, 2000\]: Recall@2000 needs at least 2000 gallery items, but the gallery holds "
            r"1438 \(the train split\); use ks of at most 1438\.$",
        ),
    ],
)
def test_bad_values_give_clear_errors(tmp_path, overrides, match):
    with pytest.raises(ConfigError, match=match):
        build(tmp_path, *overrides)


def test_ks_beyond_a_leave_one_out_gallery_are_refused(tmp_path):
    glyphs = next(path for path in YAMLS if path.name == "glyphs_default.yaml")
    with pytest.raises(
        ConfigError, match=r"holds 5487 \(the other test items, leave-one-out\); use ks of at most"
    ):
        build(tmp_path, "evaluation.ks=[1,5488]", config=glyphs)


def test_a_short_last_query_batch_is_evaluated_without_composers_split_warning(tmp_path):
    # 359 digits queries in batches of 100: Composer warned "Cannot split tensor of length 59 into
    # batches of size 100" at every evaluation.
    run = build(tmp_path, "trainer.max_duration=1ba", "evaluation.batch_size=100")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.trainer.eval()
    assert [str(w.message) for w in caught if "Cannot split" in str(w.message)] == []
    assert 0.0 <= float(run.trainer.state.eval_metric_values["recall_at_1"]) <= 1.0


def test_malformed_files_and_overrides(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping of sections"):
        load_config(tmp_path / "list.yaml")
    (tmp_path / "broken.yaml").write_text("data: {name: [\n")
    with pytest.raises(ConfigError, match="not a valid YAML config"):
        load_config(tmp_path / "broken.yaml")
    with pytest.raises(ConfigError, match=r"override 'seed' is not of the form key\.path=value"):
        load_config(DIGITS, ["seed"])


def test_one_cycle_scheduler_follows_one_cycle_lr():
    steps, pct, div, final = 100, 0.3, 25.0, 1e4
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    reference = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=1.0, total_steps=steps + 1, pct_start=pct, div_factor=div,
        final_div_factor=final, cycle_momentum=False,
    )  # fmt: skip
    ours = OneCycleScheduler(pct_start=pct, div_factor=div, final_div_factor=final)
    torch_lrs = []
    for _ in range(steps + 1):
        torch_lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        reference.step() if len(torch_lrs) <= steps else None
    ours_lrs = [ours.multiplier(step / steps) for step in range(steps + 1)]
    assert ours_lrs[0] == pytest.approx(1 / div) and ours_lrs[-1] == pytest.approx(1 / (div * final))
    assert max(ours_lrs) == pytest.approx(1.0)
    assert max(abs(a - b) for a, b in zip(ours_lrs, torch_lrs)) < 0.05
    assert all(math.isfinite(v) for v in ours_lrs)


def test_other_registry_entries_build(tmp_path):
    cfg = load_config(DIGITS, [*QUIET, "trainer.max_duration=2ba", "evaluation.interval=null"])
    cfg.sampler = {
        "name": "two_stream",
        "primary_batch_size": 24,
        "secondary_batch_size": 8,
        "primary_fraction": 0.75,
    }
    cfg.model.loss = {"name": "multi_similarity"}
    cfg.algorithms.hard_negative_mining = {"strategy": "multi_similarity"}
    cfg.optimizer = {"name": "sgd", "lr": 0.05, "momentum": 0.9}
    cfg.scheduler = {"name": "cosine_with_warmup", "t_warmup": "1ba"}
    cfg.callbacks.lr_monitor = {}
    cfg.loggers = {"in_memory": {}, "file": {}}
    run = build_run(cfg, tmp_path / "run")
    sampler = run.train_dataloader.batch_sampler
    assert sampler.batch_size == 32 and run.train_dataloader.batch_size == 32
    run.trainer.fit()
    assert int(run.trainer.state.timestamp.batch) == 2 and torch.isfinite(run.trainer.state.loss).all()
    assert (tmp_path / "run" / "logs-rank0.txt").is_file()


def test_every_registry_name_resolves_to_its_target():
    """Registry targets are dotted strings imported on first use: each must exist (wandb's class too)."""
    from composer_dynsample.config import names
    from composer_dynsample.config.components import lookup

    registries = ("DATASETS", "ENCODERS", "LOSSES", "SAMPLERS", "ALGORITHMS", "CALLBACKS", "OPTIMIZERS")
    for registry_name in (*registries, "SCHEDULERS", "LOGGERS"):
        registry = getattr(names, registry_name)
        for name in registry:
            entry = lookup(registry_name, name, registry)
            assert callable(entry.target), (registry_name, name)
    assert names.SAMPLERS["two_stream"].extra == {"primary_fraction": 0.5}


def test_the_finetune_recipe_is_the_documented_one():
    cfg = load_config(next(path for path in YAMLS if path.name == "finetune_code_search.yaml"))
    assert (cfg.optimizer.name, cfg.optimizer.lr, cfg.scheduler.name) == ("adamw", 2e-5, "linear_with_warmup")
    assert (cfg.scheduler.t_warmup, cfg.scheduler.alpha_f, cfg.evaluation.at_start) == ("0.1dur", 0.0, True)
    assert cfg.model.encoder.name == "transformer" and cfg.sampler.classes_per_batch == 16
