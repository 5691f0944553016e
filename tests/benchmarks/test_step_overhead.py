"""benchmarks/step_overhead.py: the recipe's whole training path reads no tensor on the host between logging steps."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.benchmarks.helpers import load_benchmark


def test_a_short_run_of_the_recipe_makes_no_host_read_and_reports_its_ratio(tmp_path: Path) -> None:
    step_overhead = load_benchmark("step_overhead")
    threads = torch.get_num_threads()
    try:
        result = step_overhead.main(["--quick", "--steps", "6", "--warmup", "2", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)  # the benchmark sets its own
    # The recipe has no miner (the loss takes the batch's text groups itself), so no logging step of its own:
    # every one of these 6 steps goes through the CLI's own build (the text collate, the token encoder,
    # InfoNCE with duplicate ids) and must read nothing.
    assert result["log_interval"] == 0 and result["non_logging_steps"] == 6
    assert result["host_reads_per_step"] == 0
    assert result["batch_shape"] == [256, 128]
    # Composer's own reads are listed apart, by call site (its loss .item() among them).
    assert any(
        site.startswith("item at composer/trainer/trainer.py") for site in result["composer_reads_per_step"]
    )
    stored = json.loads((tmp_path / "step_overhead_quick.json").read_text())
    assert stored["ratio"] == result["ratio"] > 0 and stored["goals"][1]["met"] is True
    assert "Composer's own host reads per step" in (tmp_path / "step_overhead_quick.md").read_text()
    assert stored["our_reads_per_step_by_site"] == {}  # none of this package's, on any step of this run
    # The operations that would sync on CUDA, counted on the CPU: Composer's value reads only; the loss's
    # masks of repeated texts are sorted and searched on the device (the miner's variable-size tuples, three
    # such operations a step, went with the miner).
    assert (
        stored["sync_ops_per_step_by_site"] == {} and stored["sync_ops_per_step"]["composer_dynsample"] == 0
    )
    assert stored["sync_ops_per_step"]["composer"] >= 1


def test_the_sync_counter_names_the_line_that_synchronised(tmp_path: Path) -> None:
    import warnings

    step_overhead = load_benchmark("step_overhead")
    modes: list[str] = []
    syncs = step_overhead.SyncSites(debug_mode=modes.append)
    source = tmp_path / "recipe_step.py"  # stands for the line of a step that called a synchronising op
    source.write_text(
        "import warnings\n"
        "def step():\n"
        "    warnings.warn('called a synchronizing CUDA operation')\n"
        "    warnings.warn('an unrelated warning')\n"
    )
    scope: dict = {}
    exec(compile(source.read_text(), str(source), "exec"), scope)
    for _ in range(2):
        syncs.batch_start(None, None)
        scope["step"]()
        syncs.batch_end(None, None)
    assert syncs.steps == [1, 1] and modes == ["warn", "default"] * 2
    assert dict(syncs.sites) == {"other recipe_step.py:3": 2}
    with warnings.catch_warnings(record=True) as after:  # the step's hook is gone after BATCH_END
        warnings.simplefilter("always")
        scope["step"]()
    assert len(after) == 2
