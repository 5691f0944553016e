"""benchmarks/finetune_mix.py: the mixed run's data section and the table of the two recipes."""

from __future__ import annotations

import pytest

from tests.benchmarks.helpers import load_benchmark

pytest.importorskip("bm25s")  # finetune_mix imports finetune_code, whose harness imports quality_code


def test_the_mix_gives_each_source_its_own_files_and_cache(tmp_path):
    bench = load_benchmark("finetune_mix")
    data = {
        name: {"train": {"path": f"{name}/train.jsonl"}, "test": {"path": f"{name}/test.jsonl"}}
        for name in bench.SOURCES
    }
    section = bench.mix_data(data, bench.SIZE, tmp_path)
    assert section["name"] == "mix" and list(section["sources"]) == list(bench.SOURCES)
    for name, source in section["sources"].items():
        assert (source["path"], source["test_path"]) == (f"{name}/train.jsonl", f"{name}/test.jsonl")
        assert source["cache_dir"] == str(tmp_path / name) and source["max_length"] == 128


def test_the_table_holds_each_sources_difference_and_the_step_ratio():
    bench = load_benchmark("finetune_mix")
    records = [
        {"seed": s, "merged": {"code": 0.70 + d, "docstring": 0.60, "s_per_step": 2.0},
         "mix": {"code": 0.72 + d, "docstring": 0.60 + d, "s_per_step": 2.2}}
        for s, d in enumerate((0.0, 0.01, 0.02))
    ]  # fmt: skip
    summary, text = bench.summarise(records)
    assert summary["mix"]["code"][0] == pytest.approx(0.73) and summary["ratio"] == pytest.approx(1.1)
    assert summary["goal"]["met"] is False
    last = text.splitlines()[-1]
    assert last.startswith("| mix - merged | +0.0200 +- ") and "1.100x" in last
