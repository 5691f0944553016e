"""The miner-objects benchmark compares like with like: its bare path returns what the object returns."""

from __future__ import annotations

import pytest
import torch

from tests.benchmarks.helpers import load_benchmark

bench = load_benchmark("miner_objects")


@pytest.mark.parametrize("name", list(bench.OPTIONS))
def test_the_bare_path_and_the_object_return_the_same_tuples(name):
    emb, labels = bench.make_batch(64)
    outputs = []
    for call in (bench.bare_call(name), bench.MINERS[name](**bench.OPTIONS[name])):
        torch.manual_seed(3)  # the random miners draw from the global generator
        outputs.append([t.tolist() for t in call(emb, labels)])
    assert outputs[0] == outputs[1]
    assert sum(len(t) for t in outputs[0]) > 0


def test_the_goals_read_the_worst_ratio_at_training_batch_sizes():
    rows = [
        {"miner": "a", "batch": 32, "object_over_bare": 3.0},
        {"miner": "b", "batch": 256, "object_over_bare": 1.02},
    ]
    goals = bench.goal_rows(rows)
    assert [g["met"] for g in goals] == [True]
    assert "1.020x (b, B=256)" in goals[0]["measured"]
    goals = bench.goal_rows([*rows, {"miner": "c", "batch": 1024, "object_over_bare": 1.08}])
    assert [g["met"] for g in goals] == [False]
    assert "1.080x (c, B=1024)" in goals[0]["measured"]
