"""benchmarks/gpu.py: the CPU-only run, the tuple comparison it trusts, and its checks run on the CPU.

Without CUDA the script skips every check (a smoke run of that path below); the checks themselves take
a device, so here they run with the CPU standing in for the GPU, and the comparison of mined tuples is
tested on CPU tensors: it must find a real difference and explain a float32 near-tie.
"""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import pytest
import torch

from tests.benchmarks.helpers import load_benchmark
from tests.benchmarks.quick_runs import run_quick

CPU = torch.device("cpu")


def _benchmark_module(name: str):
    return load_benchmark(name)


gpu = _benchmark_module("gpu")
tuples = _benchmark_module("_mined_tuples")
miners = _benchmark_module("_gpu_miners")
ranks = _benchmark_module("_gpu_ranks")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only path runs where CUDA is not available")
@pytest.mark.timeout(120)
def test_cpu_only_quick_run_skips_every_check_and_says_why(tmp_path: Path) -> None:
    done = run_quick("gpu", tmp_path, timeout=110)
    result = json.loads((tmp_path / "gpu_cpu_only_quick.json").read_text())
    assert list(result["checks"]) == list(gpu.CHECKS)
    for name, check in result["checks"].items():
        assert check["status"] == "skipped", name
        assert "CUDA" in check["reason"], name
    assert result["cuda"]["available"] is False
    table = (tmp_path / "gpu_cpu_only_quick.md").read_text()
    for name in gpu.CHECKS:
        assert f"| {name} | skipped | CUDA is not available" in table
        assert f"| {name} | skipped |" in done.stdout
    assert not list(tmp_path.glob("gpu_quick.*")) and not list(tmp_path.glob("gpu.*"))  # a GPU's name


@pytest.mark.parametrize("module", ["gpu", "_mined_tuples", "_cuda"])
def test_docstring_examples_run(module: str) -> None:
    result = doctest.testmod(_benchmark_module(module))
    assert result.attempted > 0 and result.failed == 0


def test_skip_reasons_name_what_is_missing() -> None:
    assert all("CUDA" in reason for reason in gpu.skip_reasons(False, 0, True).values())
    one_gpu = gpu.skip_reasons(True, 1, True)
    assert [name for name, reason in one_gpu.items() if reason] == ["nccl"]
    assert "found 1" in one_gpu["nccl"]
    assert not any(gpu.skip_reasons(True, 2, True).values())
    assert "NCCL" in gpu.skip_reasons(True, 2, False)["nccl"]


def test_unknown_check_names_are_refused_with_the_valid_ones() -> None:
    assert gpu.parse_checks("nccl, miners") == ["miners", "nccl"]
    with pytest.raises(ValueError, match=r"--checks: unknown check 'miner'; valid: miners, training"):
        gpu.parse_checks("miner")


# --- the comparison of mined tuples ------------------------------------------------------------------


def test_tuples_in_another_order_compare_equal() -> None:
    a, p, n = torch.tensor([0, 1, 2]), torch.tensor([1, 0, 3]), torch.tensor([2, 3, 0])
    order = torch.tensor([2, 0, 1])
    result = tuples.compare_tuples((a, p, n), (a[order], p[order], n[order]), 4)
    assert result.equal and result.differing == 0 and result.counts == (3, 3)


def test_one_changed_negative_is_two_differing_tuples() -> None:
    first = (torch.tensor([0, 1]), torch.tensor([1, 0]), torch.tensor([2, 2]))
    second = (torch.tensor([0, 1]), torch.tensor([1, 0]), torch.tensor([2, 3]))
    result = tuples.compare_tuples(first, second, 4)
    assert not result.equal and result.differing == 2
    assert tuples.decode_keys(result.only_first[0], 4, 3) == (
        torch.tensor([1]),
        torch.tensor([0]),
        torch.tensor([2]),
    )
    assert tuples.decode_keys(result.only_second[0], 4, 3)[2].tolist() == [3]


def test_pairs_compare_positive_and_negative_pairs_separately() -> None:
    positive, negative = (torch.tensor([0]), torch.tensor([1])), (torch.tensor([0]), torch.tensor([2]))
    # The same index pairs as positives in one and negatives in the other are different results.
    result = tuples.compare_tuples((*positive, *negative), (*negative, *positive), 3)
    assert not result.equal and result.differing == 4


def test_a_repeated_tuple_is_not_equal_to_one() -> None:
    once = (torch.tensor([0]), torch.tensor([1]), torch.tensor([2]))
    twice = (torch.tensor([0, 0]), torch.tensor([1, 1]), torch.tensor([2, 2]))
    assert not tuples.compare_tuples(once, twice, 3).equal


def test_comparing_triplets_with_pairs_is_refused() -> None:
    triplets = (torch.tensor([0]), torch.tensor([1]), torch.tensor([2]))
    with pytest.raises(ValueError, match="cannot compare a tuple of 3 tensors with one of 4"):
        tuples.compare_tuples(triplets, (*triplets, torch.tensor([0])), 3)
    with pytest.raises(ValueError, match=r"must hold 3 tensors \(triplets\) or 4 \(pairs\), got 2"):
        tuples.tuple_keys(triplets[:2], 3)


def _perturbed(scale: float, batch: int = 1024) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    embeddings, labels = miners.clustered_embeddings(batch)
    noise = torch.randn(embeddings.shape, generator=torch.Generator().manual_seed(1))
    return embeddings, torch.nn.functional.normalize(embeddings + scale * noise, dim=1), labels


@pytest.mark.parametrize(
    "name", ["batch_hard", "semi_hard", "hard_topk", "multi_similarity", "distance_weighted"]
)
def test_a_perturbed_copy_is_caught_as_a_real_difference(name: str) -> None:
    embeddings, perturbed, labels = _perturbed(0.05, batch=256)
    first = miners.run_miner(name, embeddings, labels, "cpu")
    second = miners.run_miner(name, perturbed, labels, "cpu")
    result = tuples.compare_tuples(first, second, len(labels))
    distances = tuples.cosine_distances(embeddings)
    unexplained = tuples.unexplained_differences(
        name, result, first, second, distances, labels, miners.tie_params(name)
    )
    assert not result.equal and unexplained > 0


@pytest.mark.parametrize(
    "name", ["batch_hard", "semi_hard", "hard_topk", "multi_similarity", "distance_weighted"]
)
def test_a_changed_choice_is_not_taken_for_a_tie(name: str) -> None:
    embeddings, labels = miners.clustered_embeddings(256)
    first = miners.run_miner(name, embeddings, labels, "cpu")
    distances = tuples.cosine_distances(embeddings)
    second = [t.clone() for t in first]
    anchor = int(second[-2][0]) if len(second) == 4 else int(second[0][0])
    negatives = (labels != labels[anchor]).nonzero().view(-1)
    second[-1][0] = negatives[distances[anchor, negatives].argmax()]  # the farthest negative instead
    result = tuples.compare_tuples(first, second, len(labels))
    unexplained = tuples.unexplained_differences(
        name, result, first, second, distances, labels, miners.tie_params(name)
    )
    assert result.differing == 2 and unexplained == 2


def test_float32_rounding_flips_are_explained_as_ties() -> None:
    """A perturbation at float32's rounding level flips some choices (as another device's matmul does)."""
    embeddings, perturbed, labels = _perturbed(1e-6)
    distances = tuples.cosine_distances(embeddings)
    differing = 0
    for name in ["batch_hard", "semi_hard", "hard_topk", "multi_similarity", "distance_weighted"]:
        first = miners.run_miner(name, embeddings, labels, "cpu")
        second = miners.run_miner(name, perturbed, labels, "cpu")
        result = tuples.compare_tuples(first, second, len(labels))
        differing += result.differing
        params = miners.tie_params(name)
        assert tuples.unexplained_differences(name, result, first, second, distances, labels, params) == 0
    assert differing > 0  # the flips happened, so the rules were exercised


def test_distance_weighted_weights_exclude_positives_and_far_negatives() -> None:
    labels = torch.tensor([0, 0, 1, 1])
    row = torch.tensor([0.0, 0.3, 0.5, 1.5], dtype=torch.float64)  # cos distance 1.5: d > 1.4
    weights = tuples.distance_weighted_weights(row, labels, 0, {"dim": 8})
    assert weights.tolist()[:2] == [0.0, 0.0] and weights[3] == 0 and weights[2] == pytest.approx(1.0)


# --- the checks, with the CPU standing in for the GPU -----------------------------------------------


def test_miners_check_on_the_cpu_compares_every_miner() -> None:
    result = miners.check_miners(CPU, (64,), 64, budget_s=0.01)
    assert result["status"] == "ok", result["summary"]
    assert [row["miner"] for row in result["rows"]] == list(miners.MINER_CALLS)
    assert all(row["identical"] and row["tuples_cpu"] > 0 for row in result["rows"])
    assert len(result["dtype_rows"]) == 2 * len(miners.MINER_CALLS)
    assert all(row["identical"] for row in result["dtype_rows"])
    tables = miners.miners_tables(result)
    assert "| batch_hard | 64 |" in tables[0] and "| semi_hard | 64 | bfloat16 | True |" in tables[1]


def test_pin_memory_check_counts_batches_per_second() -> None:
    result = gpu.check_pin_memory(CPU, rows=256, image=8, batch=64, rounds=1, pins=(False,), workers=(0,))
    assert result["status"] == "ok"
    (row,) = result["rows"]
    assert row["workers"] == 0 and row["pin_memory"] is False and row["batches_per_s"] > 0


@pytest.mark.timeout(120)
def test_transformer_check_takes_steps_in_both_precisions() -> None:
    pytest.importorskip("transformers")
    result = gpu.check_transformer(CPU, 1, 32, batch=4, length=8, steps=1, rounds=1)
    assert result["status"] == "ok", result
    assert [row["precision"] for row in result["rows"]] == ["fp32", "bf16 autocast"]
    assert all(row["steps_per_s"] > 0 and row["step_peak_mib"] is None for row in result["rows"])


@pytest.mark.timeout(180)
def test_cross_rank_step_on_two_gloo_ranks_matches_one_process() -> None:
    result = ranks.check_nccl(batch=16, steps=1, backend="gloo", device_kind="cpu")
    assert result["status"] == "ok", result
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    assert all(r["grad_matches"] and r["grad_scale"] > 0 for r in result["ranks"])


def test_training_command_sets_precision_and_device_through_the_cli() -> None:
    command = gpu.training_command("amp_bf16", "gpu", Path("run"), 3)
    assert command[1:5] == ["-m", "composer_dynsample", "train", "yamls/digits_quick.yaml"]
    assert {"trainer.precision=amp_bf16", "trainer.device=gpu", "trainer.max_duration=3ep"} <= set(command)


@pytest.mark.timeout(240)
def test_training_check_records_a_run_and_a_refused_precision() -> None:
    result = gpu.check_training("cpu", epochs=1, precisions=("fp32", "fp64"))
    ok, refused = result["rows"]
    assert ok["exit_code"] == 0 and 0 < ok["recall_at_1"] <= 1 and ok["s_per_epoch"] > 0
    assert refused["exit_code"] == 2 and "fp64" in refused["error"]
    assert result["status"] == "failed" and "failed: fp64" in result["summary"]


def test_a_check_that_raises_is_recorded_and_the_others_still_run(tmp_path: Path) -> None:
    def broken() -> dict:
        raise RuntimeError("CUDA error: an illegal memory access\nmore detail")

    runners = {"miners": broken, "pin_memory": lambda: {"status": "ok", "summary": "fine", "rows": []}}
    reasons = {"miners": None, "pin_memory": None, "nccl": "NCCL needs 2 CUDA devices, found 1"}
    results = gpu.run_checks(["miners", "pin_memory", "nccl"], reasons, runners)
    assert results["miners"]["status"] == "error"
    assert results["miners"]["reason"] == "RuntimeError: CUDA error: an illegal memory access"
    assert results["pin_memory"]["status"] == "ok" and results["nccl"]["status"] == "skipped"
    table = gpu.report(results, tmp_path, True, on_cuda=True)
    assert (tmp_path / "gpu_quick.json").exists() and not (tmp_path / "gpu_cpu_only_quick.json").exists()
    assert "| miners | error | RuntimeError: CUDA error" in table
    assert json.loads((tmp_path / "gpu_quick.json").read_text())["checks"]["nccl"]["status"] == "skipped"


def test_the_corpus_search_check_passes_with_the_cpu_standing_in_for_the_gpu() -> None:
    corpus = _benchmark_module("_gpu_corpus")
    result = corpus.check_corpus_search(CPU, pairs=3_000, anchors=300)
    assert result["status"] == "passed", result
    exact, ivf = result["rows"][:2]
    assert exact["equal_to_cpu"] and exact["window_recall"] == 1.0 and ivf["window_recall"] >= 0.9
