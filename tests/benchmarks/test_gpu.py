"""benchmarks/gpu.py: the CPU-only run, its time budget, the tuple comparison it trusts, and its checks
run on the CPU.

Without CUDA the script skips every check (a smoke run of that path below); the checks themselves take
a device, so here they run with the CPU standing in for the GPU, and the comparison of mined tuples is
tested on CPU tensors: it must find a real difference and explain a float32 near-tie. The deadlines are
tested with fake workers (plain Python, no torch) that sleep past a tiny share.
"""

from __future__ import annotations

import doctest
import inspect
import json
import os
import re
import sys
import time
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
budgets = _benchmark_module("_gpu_budget")
training = _benchmark_module("_gpu_training")
corpus = _benchmark_module("_gpu_corpus")


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


@pytest.mark.parametrize("module", ["gpu", "_mined_tuples", "_cuda", "_gpu_budget"])
def test_docstring_examples_run(module: str) -> None:
    result = doctest.testmod(_benchmark_module(module))
    assert result.attempted > 0 and result.failed == 0


def test_skip_reasons_name_what_is_missing() -> None:
    assert all("CUDA" in reason for reason in gpu.skip_reasons("cuda", False, 0, True).values())
    one_gpu = gpu.skip_reasons("cuda", True, 1, True)
    assert [name for name, reason in one_gpu.items() if reason] == ["nccl"]
    assert "found 1" in one_gpu["nccl"]
    assert not any(gpu.skip_reasons("cuda", True, 2, True).values())
    assert "NCCL" in gpu.skip_reasons("cuda", True, 2, False)["nccl"]


def test_the_cpu_dry_run_skips_only_what_needs_cuda_whatever_the_machine() -> None:
    for cuda in (False, True):
        reasons = gpu.skip_reasons("cpu", cuda, 2 if cuda else 0, cuda)
        assert [name for name, reason in reasons.items() if reason] == ["pin_memory", "nccl"]


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
    result = training.check_pin_memory(
        CPU, rows=256, image=8, batch=64, rounds=1, pins=(False,), workers=(0,)
    )
    assert result["status"] == "ok"
    (row,) = result["rows"]
    assert row["workers"] == 0 and row["pin_memory"] is False and row["batches_per_s"] > 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("precisions", [("fp32", "bf16 autocast"), ("fp32",)])
def test_transformer_check_takes_steps_in_each_precision(precisions: tuple[str, ...]) -> None:
    pytest.importorskip("transformers")
    result = training.check_transformer(
        CPU, 1, 32, batch=4, length=8, steps=1, rounds=1, precisions=precisions
    )
    assert result["status"] == "ok", result
    assert tuple(row["precision"] for row in result["rows"]) == precisions
    assert all(row["steps_per_s"] > 0 and row["step_peak_mib"] is None for row in result["rows"])


@pytest.mark.timeout(180)
def test_cross_rank_step_on_two_gloo_ranks_matches_one_process() -> None:
    result = ranks.check_nccl(CPU, batch=16, steps=1)
    assert result["status"] == "ok", result
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    assert all(r["backend"] == "gloo" and r["grad_matches"] and r["grad_scale"] > 0 for r in result["ranks"])


def test_training_arguments_set_precision_and_device_through_the_cli() -> None:
    arguments = training.training_arguments("amp_bf16", "gpu", Path("run"), 3)
    assert arguments[:2] == ["train", str(training.RECIPE)] and training.RECIPE.exists()
    assert {"trainer.precision=amp_bf16", "trainer.device=gpu", "trainer.max_duration=3ep"} <= set(arguments)
    assert training.trainer_device(torch.device("cuda", 0)) == "gpu"  # Composer refuses "cuda"


@pytest.mark.timeout(240)
def test_training_check_records_a_run_and_a_refused_precision_in_one_process() -> None:
    result = training.check_training(CPU, epochs=1, precisions=("fp32", "fp64"))
    ok, refused = result["rows"]
    assert ok["exit_code"] == 0 and 0 < ok["recall_at_1"] <= 1 and ok["s_per_epoch"] > 0
    assert refused["exit_code"] == 2 and "fp64" in refused["error"]
    assert result["status"] == "failed" and "failed: fp64" in result["summary"]


def test_the_corpus_search_check_searches_only_a_sample_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    searched = []

    def recording(**options):
        searched.append((options["search"], options.get("pairs")))
        return candidates(**options)

    candidates = corpus.corpus_candidates
    monkeypatch.setattr(corpus, "corpus_candidates", recording)
    result = corpus.check_corpus_search(CPU, pairs=3_000, anchors=300)
    assert result["status"] == "ok", result
    cpu_exact, device_exact, ivf = result["rows"]
    assert cpu_exact["on"] == "cpu" and device_exact["equal_to_cpu"] and ivf["window_recall"] >= 0.9
    assert [(search, None if pairs is None else pairs.size) for search, pairs in searched] == [
        ("exact", 300),
        ("exact", 300),
        ("ivf", None),  # every anchor
    ]


# --- the plans: the budget each check has, and its sizes ---------------------------------------------


def test_the_full_run_fits_5_minutes_and_quick_90_seconds_worker_start_included() -> None:
    for mode, limit in [("full", 300), ("quick", 90)]:
        budget = gpu.budget_for(mode)
        assert budget.total_s <= limit
        assert budget.start_s + sum(budget.shares_s.values()) <= budget.total_s, mode
    assert gpu.budget_for("cpu").start_s + sum(gpu.budget_for("cpu").shares_s.values()) <= gpu.TOTAL_S["cpu"]


def test_budget_scales_every_share_and_refuses_a_non_positive_one() -> None:
    doubled = gpu.budget_for("full", 600)
    assert doubled.total_s == 600 and doubled.start_s == 2 * gpu.START_S["full"]
    assert doubled.shares_s == {name: 2 * plan.share_s for name, plan in gpu.PLANS["full"].items()}
    with pytest.raises(ValueError, match="must be > 0, got 0"):
        gpu.budget_for("quick", 0)


@pytest.mark.parametrize("mode", ["full", "quick", "cpu"])
def test_every_plan_sizes_every_check_with_its_functions_keywords(mode: str) -> None:
    assert list(gpu.PLANS[mode]) == list(gpu.CHECKS) == list(gpu.FUNCTIONS)
    for name, plan in gpu.PLANS[mode].items():
        module, function = gpu.FUNCTIONS[name]
        inspect.signature(getattr(_benchmark_module(module), function)).bind(CPU, **plan.sizes)


@pytest.mark.parametrize("mode", ["full", "quick", "cpu"])
def test_the_corpus_cpu_reference_is_a_small_sample_of_anchors(mode: str) -> None:
    sizes = gpu.PLANS[mode]["corpus_search"].sizes
    assert sizes["anchors"] <= 500 and sizes["anchors"] <= sizes["pairs"]
    assert gpu.PLANS["full"]["corpus_search"].sizes["pairs"] == 1_000_000


def test_the_cpu_dry_run_trains_and_steps_in_fp32_only() -> None:
    assert gpu.PLANS["cpu"]["training"].sizes["precisions"] == ("fp32",)
    assert gpu.PLANS["cpu"]["transformer"].sizes["precisions"] == ("fp32",)
    assert gpu.run_mode("cpu", quick=False) == gpu.run_mode("cpu", quick=True) == "cpu"


# --- the run under deadlines, with fake workers --------------------------------------------------------

# A worker that speaks _gpu_budget's protocol without torch: argv = events file, folder, check names.
# "slow" starts a grandchild (its pid written to the folder) and sleeps; "crash" dies; others take 0.1 s.
FAKE_WORKER = """
import json, os, subprocess, sys, time
events, folder, names = sys.argv[1], sys.argv[2], sys.argv[3:]
def emit(**event):
    with open(events, "a") as stream:
        stream.write(json.dumps(event) + "\\n")
emit(event="ready", cuda={"available": True}, machine="fake")
for name in names:
    emit(event="start", check=name)
    if name == "slow":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open(os.path.join(folder, "grandchild.pid"), "w").write(str(child.pid))
        time.sleep(60)
    if name == "crash":
        os._exit(3)
    time.sleep(0.1)
    emit(event="done", check=name, result={"status": "ok", "summary": "fine", "seconds": 0.1})
"""


def _fake_command(folder: Path, script: str = FAKE_WORKER):
    return lambda names, events: [sys.executable, "-c", script, str(events), str(folder), *names]


def _budget(**shares: float) -> budgets.Budget:
    return budgets.Budget(start_s=10, shares_s={"fast": 10, "other": 10, **shares}, total_s=60)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


@pytest.mark.timeout(30)
def test_a_check_past_its_share_is_timed_out_with_its_processes_and_the_next_still_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    start = time.monotonic()
    run = budgets.run_with_deadlines(["slow", "fast"], _budget(slow=0.5), _fake_command(tmp_path))
    assert time.monotonic() - start < 10
    slow, fast = run.results["slow"], run.results["fast"]
    assert slow["status"] == "timed_out" and slow["reason"] == "stopped after 0.5 s, its share"
    assert 0.5 <= slow["seconds"] < 3
    assert fast["status"] == "ok" and len(run.starts_s) == 2  # a fresh worker ran the rest
    deadline = time.monotonic() + 5
    pid = int((tmp_path / "grandchild.pid").read_text())
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(pid), "the check's own child process outlived the kill"
    err = capsys.readouterr().err
    assert re.search(r"^slow: timed_out in \d\.\d s \(stopped after 0.5 s, its share\)$", err, re.M)
    assert re.search(r"^fast: ok in 0\.1 s$", err, re.M)


@pytest.mark.timeout(30)
def test_a_worker_that_dies_in_a_check_records_an_error_and_a_fresh_one_runs_the_rest(tmp_path: Path) -> None:
    run = budgets.run_with_deadlines(["crash", "fast"], _budget(crash=10), _fake_command(tmp_path))
    assert run.results["crash"]["status"] == "error"
    assert "exited with code 3 during this check" in run.results["crash"]["reason"]
    assert run.results["fast"]["status"] == "ok"


@pytest.mark.timeout(30)
def test_the_checks_left_when_the_total_is_spent_are_timed_out_not_started(tmp_path: Path) -> None:
    budget = budgets.Budget(10, {"slow": 30, "fast": 30}, total_s=budgets.REPORT_S + 0.5)
    run = budgets.run_with_deadlines(["slow", "fast"], budget, _fake_command(tmp_path))
    assert "were spent" in run.results["slow"]["reason"]
    assert run.results["fast"] == {
        "status": "timed_out", "reason": f"not started: the run's {budget.total_s:g} s were spent", "seconds": 0,
    }  # fmt: skip


@pytest.mark.timeout(30)
def test_a_worker_not_ready_in_its_start_up_share_times_out_every_check(tmp_path: Path) -> None:
    never_ready = "import time; time.sleep(60)"
    budget = budgets.Budget(0.3, {"fast": 10, "other": 10}, total_s=60)
    run = budgets.run_with_deadlines(["fast", "other"], budget, _fake_command(tmp_path, never_ready))
    assert [r["status"] for r in run.results.values()] == ["timed_out", "timed_out"]
    assert "not ready" in run.results["other"]["reason"] and not run.ready


def test_the_summary_has_every_checks_status_seconds_and_share() -> None:
    results = {
        "miners": {"status": "ok", "summary": "fine", "seconds": 12.3},
        "training": {"status": "timed_out", "reason": "stopped after 60 s, its share", "seconds": 60.1},
        "nccl": {"status": "skipped", "reason": "NCCL needs 2 CUDA devices, found 1"},
    }
    table = gpu.summary_table(results, {"miners": 40, "training": 60, "nccl": 45})
    assert "| miners | ok | fine | 12.3 | 40 |" in table
    assert "| training | timed_out | stopped after 60 s, its share | 60.1 | 60 |" in table
    assert "| nccl | skipped | NCCL needs 2 CUDA devices, found 1 |  | 45 |" in table


# --- the worker, in this process ---------------------------------------------------------------------


def test_a_check_that_raises_is_an_error_and_the_worker_leaves_the_rest_to_a_fresh_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(device, **sizes) -> dict:
        torch.backends.cuda.matmul.allow_tf32 = not torch.backends.cuda.matmul.allow_tf32  # as Composer does
        raise RuntimeError("CUDA error: an illegal memory access\nmore detail")

    monkeypatch.setattr(miners, "check_miners", broken)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    events = tmp_path / "events.jsonl"
    assert gpu.work(["miners", "pin_memory", "training"], events, "cpu", "cpu") == 0
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert [(e["event"], e.get("check")) for e in lines] == [
        ("ready", None),
        ("start", "miners"),
        ("done", "miners"),
    ]
    assert lines[0]["cuda"]["available"] is torch.cuda.is_available() and "torch" in lines[0]["machine"]
    error = lines[2]["result"]
    assert (
        error["status"] == "error" and error["reason"] == "RuntimeError: CUDA error: an illegal memory access"
    )
    assert torch.backends.cuda.matmul.allow_tf32 is tf32  # the settings a check changed are put back


def test_a_skipped_check_is_done_without_a_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        corpus, "check_corpus_search", lambda device, **sizes: {"status": "ok", "summary": "fine"}
    )
    events = tmp_path / "events.jsonl"
    gpu.work(["pin_memory", "corpus_search", "nccl"], events, "cpu", "cpu")
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert [(e["event"], e.get("check")) for e in lines[1:]] == [
        ("done", "pin_memory"), ("start", "corpus_search"), ("done", "corpus_search"), ("done", "nccl"),
    ]  # fmt: skip
    assert lines[1]["result"] == {"status": "skipped", "reason": gpu.WHY_NOT_ON_CPU["pin_memory"]}
    assert lines[3]["result"]["status"] == "ok" and lines[3]["result"]["seconds"] >= 0


def test_results_go_to_gpu_only_on_cuda_and_the_cpu_dry_run_to_an_ignored_file(tmp_path: Path) -> None:
    results = {"miners": {"status": "ok", "summary": "fine", "seconds": 1.0, "tables": ["miners:\n\n| a |"]}}
    budget = gpu.budget_for("full")
    for device, cuda, mode, written in [
        ("cuda", True, "full", "gpu.json"),
        ("cuda", False, "full", "gpu_cpu_only.json"),
        ("cpu", False, "cpu", "gpu_on_cpu_quick.json"),
        ("cpu", True, "cpu", "gpu_on_cpu_quick.json"),
    ]:
        out = tmp_path / f"{device}-{cuda}"
        run = budgets.Run(
            {k: dict(v) for k, v in results.items()}, {"cuda": {"available": cuda}, "machine": "m"}, [1.0]
        )
        table = gpu.report(run, out, mode, device, budget, wall_s=3.0)
        assert [path.name for path in out.glob("*.json")] == [written]
        assert "| miners | ok | fine | 1.0 | 40 |" in table
        stored = json.loads((out / written).read_text())
        assert "tables" not in stored["checks"]["miners"] and stored["budget"]["total_s"] == 300
        assert "miners:\n\n| a |" in (out / written.replace(".json", ".md")).read_text()
