"""``data: {name: mix}`` on 2 real processes over gloo: each step's batches from one source on both ranks
(``batches_per_draw: 2``), cross-rank mining within a source, each source scored on its own; a cross-rank
pool across sources refused on both ranks before anything trains.

Run with ``bash tests/run_distributed.sh 2`` (``python -m composer.cli.launcher -n 2 ... -m pytest``).
"""

from __future__ import annotations

import pytest
from composer.utils import dist

pytest.importorskip("tokenizers")

from composer_dynsample.cli.commands import train
from composer_dynsample.config import build_run, load_config
from composer_dynsample.config.components import ConfigError
from tests.cli.test_mix import _sources
from tests.distributed._helpers import shared_tmp_dir

pytestmark = [pytest.mark.world_size(2), pytest.mark.filterwarnings("ignore::UserWarning")]

MINING = {"strategy": "batch_hard", "cross_rank": True, "gather": "autograd", "duplicate_key": "text_hash"}


def _config(folder, per_draw: int) -> dict:
    sources = _sources(folder) if dist.get_global_rank() == 0 else None
    sources = dist.all_gather_object(sources)[0]  # rank 0 wrote the files and the tokenizer
    return {
        "data": {"name": "mix", "sampling": "proportional", "batches_per_draw": per_draw, "sources": sources},
        "model": {"encoder": {"name": "bag_of_tokens", "token_dim": 16}, "loss": {"name": "info_nce"}},
        "sampler": {"name": "pk", "classes_per_batch": 4, "samples_per_class": 2},
        "algorithms": {"hard_negative_mining": MINING},
        "optimizer": {"name": "adamw", "lr": 0.01},
        "evaluation": {"interval": "2ba", "ks": [1]},
        "trainer": {"max_duration": "1ep", "progress_bar": False},
    }


def test_a_mix_trains_on_two_ranks_each_step_from_one_source():
    folder = shared_tmp_dir(prefix="dynsample-mix-")
    config = _config(folder, per_draw=2)
    run = build_run(load_config(config), folder / "built")
    store, sampler = run.splits.train, run.train_dataloader.batch_sampler
    mine = [sorted({int(store.source_of_row[i]) for i in batch}) for batch in sampler]
    both = dist.all_gather_object(mine)
    assert all(len(sources) == 1 for sources in both[0] + both[1])
    assert both[0] == both[1]  # step by step, both ranks' batches come from the same source
    run.trainer.close()
    metrics = train(config, run_dir=folder / "run")
    assert metrics["world_size"] == 2 and set(metrics["sources"]) == {"code", "qa"}
    every_rank = dist.all_gather_object(metrics["sources"])
    assert every_rank[0] == every_rank[1]


def test_a_cross_rank_pool_across_sources_is_refused_on_every_rank():
    folder = shared_tmp_dir(prefix="dynsample-mix-")
    with pytest.raises(ConfigError, match=r"set data\.batches_per_draw=2"):
        build_run(load_config(_config(folder, per_draw=1)), folder / "refused")
    dist.barrier()  # both ranks got here: neither waits in a collective
