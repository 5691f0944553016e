"""benchmarks/finetune_code.py on a device: the command lines it builds, with its process runner replaced.

Nothing is trained: ``run_measured`` is replaced by a fake that records each command line and writes what
the command would have written (metrics, timings, mined triplets), and the corpus and the model are
replaced too, so ``main`` goes through end to end on any machine in a second.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.benchmarks.helpers import load_benchmark

_METRICS = {"csn_mrr": 0.5, "mrr_at_10": 0.5, "recall_at_1": 0.4, "recall_at_10": 0.9, "ndcg_at_10": 0.6}


def _after(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def _write_outputs(command: list[str]) -> None:
    """What ``command`` would have written, as the benchmark reads it back."""
    if "--st-worker" in command:
        out = Path(json.loads(_after(command, "--st-worker"))["out"])
        out.mkdir(parents=True, exist_ok=True)
        (out / "timing.json").write_text(json.dumps({"s_per_step": 0.1, "fit_s": 1.0}))
    elif "--mine-worker" in command:
        out = Path(json.loads(_after(command, "--mine-worker"))["out"])
        out.write_text("")
        out.with_suffix(".timing.json").write_text(json.dumps({"mine_s": 1.0, "triplets": 0, "pairs": 0}))
    elif _after(command, "composer_dynsample") == "train":
        run_dir = Path(_after(command, "--run-dir"))
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.json").write_text(json.dumps({**_METRICS, "wall_time_s": 2.0}))
    else:
        Path(_after(command, "--out")).write_text(json.dumps(_METRICS))


class FakeRunner:
    """``run_measured``'s stand-in: every command line it was given (those of a ``--commands`` file one by
    one), and ``processes``, the command lines of the processes it would have started."""

    def __init__(self) -> None:
        self.commands: list[list[str]] = []
        self.processes: list[list[str]] = []

    def __call__(self, command: list[str], threads: int, log: Path, **options: Any) -> tuple[float, int]:
        self.processes.append(command)
        if "--commands" in command:
            jobs = json.loads(Path(_after(command, "--commands")).read_text())
            for job in jobs:
                self.commands.append(job["command"])
                _write_outputs(job["command"])
            records = {job["name"]: {"seconds": 1.0} for job in jobs}
            Path(command[command.index("--commands") + 2]).write_text(json.dumps(records))
        else:
            self.commands.append(command)
            _write_outputs(command)
        return 1.0, 1024

    def cli(self, subcommand: str) -> list[list[str]]:
        """The ``composer-dynsample SUBCOMMAND`` command lines."""
        return [
            c
            for c in self.commands
            if "composer_dynsample" in c and _after(c, "composer_dynsample") == subcommand
        ]

    def specs(self, flag: str) -> list[dict[str, Any]]:
        """The specs given to the worker ``flag`` (``--st-worker``, ``--mine-worker``)."""
        return [json.loads(_after(c, flag)) for c in self.commands if flag in c]


def _fake_data(folder: Path, train_pairs: int, test_queries: int) -> dict[str, Any]:
    written: dict[str, Any] = {}
    for split, count in (("train", train_pairs), ("test", test_queries)):
        rows = [
            {
                "anchor": f"return the sum of list {i}",
                "positive": f"def add_{i}(a, b):\n    return a + b + {i}",
            }
            for i in range(count)
        ]
        path = folder / f"{split}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        written[split] = {"path": str(path), "pairs": count, "of": count}
    written["corpus_sha256"] = "0" * 64
    return written


@pytest.fixture
def finetune(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ModuleType:
    """The benchmark with its corpus (300 training pairs at most, 20 test queries) and model replaced."""
    pytest.importorskip("bm25s")  # quality_code, which the benchmark imports, needs it at import
    module = load_benchmark("finetune_code")
    model = tmp_path / "model"
    model.mkdir()
    monkeypatch.setattr(module, "minilm_folder", lambda: model)
    monkeypatch.setattr(
        module,
        "prepare_data",
        lambda folder, train_pairs, test_queries, quick, split_seed=0, corpus="code": _fake_data(
            folder, min(train_pairs or 300, 300), 20
        ),
    )
    return module


def _run(finetune: ModuleType, monkeypatch: pytest.MonkeyPatch, out: Path, *argv: str) -> FakeRunner:
    runner = FakeRunner()
    monkeypatch.setattr(finetune, "run_measured", runner)
    finetune.main([*argv, "--out", str(out)])
    return runner


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_every_command_names_the_device_in_composer_s_words_and_float32(
    device: str, finetune: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runner = _run(finetune, monkeypatch, tmp_path, "--device", device, "--seeds", "0", "1")
    composer = {"cuda": "gpu", "cpu": "cpu"}[device]
    trains, evals = runner.cli("train"), runner.cli("eval")
    assert len(trains) == 3 * 2 and len(evals) == 1 + 2 * 2  # zero-shot, then both ST recipes' folders
    for command in trains + evals:
        # Composer calls CUDA "gpu" and refuses "cuda"; without a device it takes any GPU it sees
        assert f"trainer.device={composer}" in command and "trainer.device=cuda" not in command
    for command in trains:  # Composer's default on a GPU is amp_fp16: float32 is said
        assert "trainer.precision=fp32" in command
    specs = runner.specs("--st-worker")
    assert len(specs) == 2 * 2 and {(spec["device"], spec["bf16"]) for spec in specs} == {(device, False)}
    assert [spec["device"] for spec in runner.specs("--mine-worker")] == [device]
    assert all("--commands" not in process for process in runner.processes)  # each run its own process


def test_the_gpu_size_is_one_epoch_of_every_pair_128_a_step_in_bf16_three_seeds_every_recipe(
    finetune: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runner = _run(finetune, monkeypatch, tmp_path, "--size", "gpu", "--device", "cuda")
    steps = 300 // 128  # every training pair of the (replaced) corpus, once
    trains = runner.cli("train")
    device = {"trainer.device=gpu", "trainer.precision=amp_bf16", f"trainer.max_duration={steps}ba"}
    for command in trains:
        assert device | {"evaluation.batch_size=256", "evaluation.gallery_batch_size=256"} <= set(command)
        batch = [
            item for item in command if "classes_per_batch=128" in item or "pairs_per_batch: 128," in item
        ]
        assert len(batch) == 1
    seeds = sorted(
        (_after(command, "--run-dir").rsplit("-", 2)[1:]) for command in trains
    )  # ours-RECIPE-SEED
    assert seeds == sorted([recipe, seed] for recipe in "234" for seed in "012")  # every recipe, every seed
    for command in runner.cli("eval"):
        assert "trainer.device=gpu" in command and "evaluation.batch_size=256" in command
    specs = runner.specs("--st-worker")
    assert sorted(spec["seed"] for spec in specs) == [0, 0, 1, 1, 2, 2]
    assert {(s["device"], s["bf16"], s["batch"], s["steps"]) for s in specs} == {("cuda", True, 128, steps)}
    assert [spec["batch_size"] for spec in runner.specs("--mine-worker")] == [256]
    # one process for sentence-transformers' runs, then one for this project's (which scores ST's folders)
    assert [_after(p, "--commands").rsplit("/", 1)[1] for p in runner.processes] == [
        "sentence-transformers-commands.json",
        "composer-commands.json",
    ]
    stored = json.loads((tmp_path / "finetune_code_gpu.json").read_text())
    assert list(stored["recipes"]) == list(finetune.RECIPES) and stored["seeds"] == [0, 1, 2]
    expected = {"size": "gpu", "precision": "bf16", "batch": 128, "steps": steps, "train_pairs": 300}
    assert {key: stored["options"][key] for key in expected} == expected
    assert "gpu" in stored and (tmp_path / "finetune_code_gpu.png").exists()
    text = (tmp_path / "finetune_code_gpu.md").read_text()
    assert f"{steps} steps of 128 pairs (one epoch)" in text and "bf16 autocast on CUDA" in text
    assert "both in bf16 autocast" in text and "(goal <= 0.5x:" in text and "(moonshot <= 25 ms:" in text
    finetune.main(["--report", "--size", "gpu", "--device", "cuda", "--out", str(tmp_path)])
    assert (tmp_path / "finetune_code_gpu.md").read_text() == text


def test_the_gpu_size_on_the_cpu_runs_in_float32_and_says_so(
    finetune: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runner = _run(finetune, monkeypatch, tmp_path, "--size", "gpu", "--device", "cpu", "--quick")
    for command in runner.cli("train"):
        assert {"trainer.device=cpu", "trainer.precision=fp32", "trainer.max_duration=8ba"} <= set(command)
    assert {spec["bf16"] for spec in runner.specs("--st-worker")} == {False}
    stored = json.loads((tmp_path / "finetune_code_gpu_quick.json").read_text())
    assert stored["seeds"] == [0] and stored["options"]["precision"] == "fp32" and stored["gpu"] is None
    assert (
        "float32 on the CPU (the GPU size's bf16 is for CUDA)"
        in (tmp_path / "finetune_code_gpu_quick.md").read_text()
    )


def test_bf16_off_cuda_is_refused_with_the_flags_named(finetune: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        finetune.main(["--size", "gpu", "--device", "cpu", "--precision", "bf16", "--out", str(tmp_path)])


def test_trainer_overrides_name_composer_s_device_and_refuse_what_it_refuses() -> None:
    common = load_benchmark("_common")
    assert common.trainer_overrides("cuda") == ["trainer.device=gpu", "trainer.precision=fp32"]
    assert common.trainer_overrides("cpu") == ["trainer.device=cpu", "trainer.precision=fp32"]
    with pytest.raises(ValueError, match=r"device must be one of \['cpu', 'cuda', 'mps'\], got 'gpu'"):
        common.trainer_overrides("gpu")
    with pytest.raises(ValueError, match="precision 'bf16' runs on CUDA only"):
        common.trainer_overrides("cpu", "bf16")


def test_a_process_of_many_runs_records_each_and_prints_its_progress(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workers = load_benchmark("_finetune_workers")
    done: list[dict] = []
    monkeypatch.setitem(workers.WORKERS, "--st-worker", done.append)
    jobs = [
        {
            "name": f"st-{seed}",
            "command": ["python", str(workers.__file__), "--st-worker", json.dumps({"seed": seed})],
        }
        for seed in (0, 1)
    ]
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    workers.run_commands(tmp_path / "jobs.json", tmp_path / "records.json")
    assert done == [{"seed": 0}, {"seed": 1}]
    assert set(json.loads((tmp_path / "records.json").read_text())) == {"st-0", "st-1"}
    assert [line.split(":")[0] for line in capsys.readouterr().out.splitlines()] == ["progress", "progress"]
    with pytest.raises(ValueError, match="command must run 'python -m composer_dynsample'"):
        workers.run_in_process(["python", "-c", "pass"])


def test_the_runner_logs_a_process_and_echoes_its_progress_lines(
    finetune: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    command = [sys.executable, "-c", "print('progress: st-0: 1.0 s'); print('other')"]
    seconds, peak_kib = finetune.run_measured(command, 1, tmp_path / "log", echo="progress: ")
    assert capsys.readouterr().out == "st-0: 1.0 s\n" and peak_kib > 0 and seconds > 0
    assert (tmp_path / "log").read_text() == "progress: st-0: 1.0 s\nother\n"
