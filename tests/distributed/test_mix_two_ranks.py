"""``data: {name: mix}`` on 2 real processes over gloo: each step's batches from one source on both ranks
(``batches_per_draw: 2``), cross-rank mining within a source, each source scored on its own; a cross-rank
pool across sources refused on both ranks before anything trains; a mix's checkpoint written mid-epoch on
1 rank resumed on 2 (2 -> 1: tests/distributed/test_elastic_resume.py).

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
from tests.distributed.elastic_run import LABELS, make_sampler, run_on_one_rank
from tests.distributed.elastic_run import train as train_indices
from tests.distributed.test_elastic_resume import _on_rank_zero

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


def _in_order(batches: dict, epoch: int) -> list[tuple[int, ...]]:
    """The batches trained in ``epoch``, in the order trained."""
    return [tuple(batch) for (e, _), batch in sorted(batches.items()) if e == epoch]


def test_a_one_rank_checkpoint_of_a_mix_resumed_on_two_ranks_trains_the_rest_of_its_epoch_in_order():
    dist.initialize_dist("cpu")
    folder = shared_tmp_dir(prefix="dynsample-mix-")
    # 16 global batches an epoch (8 of each source): batch 23 is epoch 1 with its global batches 0-6 trained.
    kwargs = {"mixed": True, "save_folder": str(folder), "save_interval": "23ba"}
    before = _on_rank_zero(run_on_one_rank, out=folder / "before.json", max_duration="23ba", **kwargs)
    load_path = str(folder / "ep1-ba23-rank0.pt")
    after = dist.all_gather_object(train_indices("3ep", mixed=True, load_path=load_path))
    mix = make_sampler(mixed=True)
    epoch, next_epoch = ([tuple(b) for b in mix.global_batches(e).tolist()] for e in (1, 2))
    assert _in_order(before, 1) == epoch[:7]
    for rank, batches in enumerate(after):  # rank r: the rest's batches r, r + 2, ...; the 9th is dropped
        assert _in_order(batches, 1) == epoch[7 + rank : 15 : 2]
        assert _in_order(batches, 2) == next_epoch[rank::2]  # then normal 2-rank epochs
    trained = [batch for batches in [before, *after] for batch in batches.values()]
    assert all(len({index >= len(LABELS) // 2 for index in batch}) == 1 for batch in trained)
