"""``composer-dynsample train`` on text pairs on 2 real processes over gloo: cross-rank InfoNCE, the pairs'
ranking metrics evaluated on sharded queries, and the run's tokenizer written once.

Run with ``bash tests/run_distributed.sh 2`` (``python -m composer.cli.launcher -n 2 ... -m pytest``).
"""

from __future__ import annotations

import json

import pytest
from composer.utils import dist

pytest.importorskip("tokenizers")

from composer_dynsample.cli.commands import train
from tests.cli.helpers import pairs_data
from tests.data.text.helpers import pair_rows, write_jsonl
from tests.distributed._helpers import shared_tmp_dir

pytestmark = [pytest.mark.world_size(2), pytest.mark.filterwarnings("ignore::UserWarning")]

RANKING = ("mrr", "mrr_at_10", "recall_at_1", "recall_at_5", "ndcg_at_10", "csn_mrr")


def test_text_pairs_train_on_two_ranks_and_rank_zero_reports():
    folder = shared_tmp_dir(prefix="dynsample-cli-")
    if dist.get_global_rank() == 0:
        write_jsonl(folder / "train.jsonl", pair_rows(64, seed=0))
        write_jsonl(folder / "test.jsonl", pair_rows(13, seed=1))  # 13 queries: a rank's share is padded
    dist.barrier()
    config = {
        "data": pairs_data(folder),
        "model": {"encoder": {"name": "bag_of_tokens", "token_dim": 16}, "loss": {"name": "info_nce"}},
        "sampler": {"name": "pk", "classes_per_batch": 8, "samples_per_class": 2},
        "algorithms": {
            "hard_negative_mining": {
                "strategy": "batch_hard",
                "cross_rank": True,
                "gather": "autograd",
                "duplicate_key": "text_hash",
            }
        },
        "optimizer": {"name": "adamw", "lr": 0.01},
        "evaluation": {"interval": "4ba", "ks": [1, 5]},
        "trainer": {"max_duration": "8ba", "save_interval": "8ba", "progress_bar": False},
    }
    run_dir = folder / "run"
    metrics = train(config, run_dir=run_dir)
    assert metrics["world_size"] == 2 and metrics["batches"] == 8 and metrics["num_queries"] == 13
    assert [entry["batch"] for entry in metrics["eval_history"]] == [4, 8]
    # The evaluator's sharded queries (one rank's share padded) give the single pass's numbers.
    for key in RANKING:
        assert metrics["eval_history"][-1][key] == pytest.approx(metrics[key], abs=1e-6), key
    every_rank = dist.all_gather_object({key: metrics[key] for key in (*RANKING, "eval_history")})
    assert every_rank[0] == every_rank[1], "the ranks disagree on the final metrics"
    if dist.get_global_rank() == 0:
        assert json.loads((run_dir / "metrics.json").read_text())["mrr"] == pytest.approx(metrics["mrr"])
        assert (run_dir / "tokenizer.json").is_file() and (
            run_dir / "checkpoints" / "latest-rank0.pt"
        ).exists()
