"""``composer-dynsample train``: a short real run writes its report and checkpoint, and resumes from it."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from composer_dynsample.cli.main import main

DIGITS = str(Path(__file__).resolve().parents[2] / "yamls" / "digits_quick.yaml")
QUIET = ["trainer.progress_bar=false"]
KEYS = ("recall_at_1", "recall_at_5", "map_at_r", "r_precision")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("digits") / "run"
    main(
        [
            "train",
            DIGITS,
            *QUIET,
            "trainer.max_duration=4ep",
            "evaluation.interval=2ep",
            "--run-dir",
            str(run_dir),
        ]
    )
    return run_dir, json.loads((run_dir / "metrics.json").read_text())


def test_a_run_writes_metrics_plot_config_and_checkpoint(first_run, capsys):
    run_dir, metrics = first_run
    for key in KEYS:
        assert 0.0 <= metrics[key] <= 1.0, key
    assert metrics["recall_at_1"] > 0.7  # chance is 0.1; 4 epochs of digits reach about 0.95
    assert metrics["recall_at_5"] >= metrics["recall_at_1"]
    assert metrics["wall_time_s"] > 0 and metrics["seed"] == 0 and metrics["epochs"] == 4
    assert metrics["num_queries"] == 359 and metrics["gallery_size"] == 1438 and metrics["world_size"] == 1
    assert [entry["epoch"] for entry in metrics["eval_history"]] == [2, 4]
    width, height = png_size(run_dir / "embeddings.png")
    assert width >= 400 and height >= 300
    assert (run_dir / "embeddings.png").stat().st_size > 10_000  # a scatter of 359 points, not a blank image
    saved = OmegaConf.load(run_dir / "config.yaml")
    assert saved.trainer.max_duration == "4ep" and saved.run_dir == str(run_dir)
    checkpoint = Path(metrics["checkpoint"])
    assert checkpoint.is_file() and checkpoint.parent == run_dir / "checkpoints"
    assert (run_dir / "checkpoints" / "latest-rank0.pt").exists()


def test_resume_continues_from_the_checkpoint(first_run, tmp_path):
    run_dir, first = first_run
    resumed_dir = tmp_path / "resumed"
    main(
        [
            "train",
            DIGITS,
            *QUIET,
            "trainer.max_duration=6ep",
            "evaluation.interval=2ep",
            f"trainer.load_path={run_dir / 'checkpoints' / 'latest-rank0.pt'}",
            "--run-dir",
            str(resumed_dir),
        ]
    )
    resumed = json.loads((resumed_dir / "metrics.json").read_text())
    assert (resumed["resumed_from_epoch"], resumed["resumed_from_batch"]) == (4, first["batches"])
    assert resumed["epochs"] == 6 and resumed["batches"] == first["batches"] // 4 * 6
    assert [entry["epoch"] for entry in resumed["eval_history"]] == [2, 4, 6]  # the history is checkpointed
    assert resumed["recall_at_1"] > 0.7


def test_the_pipeline_runs_with_worker_processes(tmp_path):
    main(["train", DIGITS, *QUIET, "trainer.max_duration=2ep", "dataloader.num_workers=2",
          "dataloader.persistent_workers=true", "evaluation.interval=null", "--run-dir", str(tmp_path)])  # fmt: skip
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["epochs"] == 2 and metrics["recall_at_1"] > 0.5
    assert OmegaConf.load(tmp_path / "config.yaml").dataloader.num_workers == 2


def test_command_line_errors_exit_with_a_message(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", DIGITS, "optimizer.lrr=1", "--run-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "unknown key 'lrr'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", DIGITS, "not-an-override", "--run-dir", str(tmp_path)])
    assert "'not-an-override' is not of the form key.path=value" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", str(tmp_path / "missing.yaml")])
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "metrics.json").exists()


def test_eval_and_embed_a_trained_checkpoint(first_run, tmp_path, capsys):
    run_dir, metrics = first_run
    checkpoint = str(run_dir / "checkpoints" / "latest-rank0.pt")
    main(["eval", DIGITS, "--checkpoint", checkpoint, "--out", str(tmp_path / "eval.json")])
    evaluated = json.loads((tmp_path / "eval.json").read_text())
    for key in KEYS:  # the weights of the last epoch, scored as train scored them
        assert evaluated[key] == pytest.approx(metrics[key], abs=1e-6), key
    assert "Recall@1" in capsys.readouterr().out
    main(
        ["embed", DIGITS, "--checkpoint", checkpoint, "--split", "test", "--out", str(tmp_path / "test.npz")]
    )
    arrays = np.load(tmp_path / "test.npz")
    assert arrays["embeddings"].shape == (359, 32) and arrays["embeddings"].dtype == np.float32
    assert arrays["labels"].shape == (359,) and arrays["indices"].tolist() == list(range(359))
    norms = np.linalg.norm(arrays["embeddings"], axis=1)
    assert np.allclose(norms, 1.0, atol=1e-5)  # the model's L2-normalised embeddings


def test_a_finished_run_resumed_without_more_duration_is_one_line(first_run, tmp_path, capsys):
    run_dir, _ = first_run
    load = f"trainer.load_path={run_dir / 'checkpoints' / 'latest-rank0.pt'}"
    with pytest.raises(SystemExit) as exit_info:
        main(
            ["train", DIGITS, *QUIET, "trainer.max_duration=4ep", load, "--run-dir", str(tmp_path / "again")]
        )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has already trained 4ep and trainer.max_duration is 4ep" in err[0]
    assert "Raise trainer.max_duration (e.g. trainer.max_duration=6ep)" in err[0]


def test_the_summary_counts_the_epochs_this_run_trained(first_run, tmp_path, capsys):
    run_dir, _ = first_run
    load = f"trainer.load_path={run_dir / 'checkpoints' / 'latest-rank0.pt'}"
    main(["train", DIGITS, *QUIET, "trainer.max_duration=5ep", "evaluation.interval=null", load,
          "--run-dir", str(tmp_path / "more")])  # fmt: skip
    assert "trained 1 epoch (resumed at epoch 4) to epoch 5 in" in capsys.readouterr().out
    assert json.loads((tmp_path / "more" / "metrics.json").read_text())["epochs_this_run"] == 1


def test_a_previous_run_is_not_overwritten_without_asking(first_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = [
        "train",
        DIGITS,
        *QUIET,
        "trainer.max_duration=1ep",
        "evaluation.interval=null",
        "--run-dir",
        str(run_dir),
    ]
    main(args)
    before = (run_dir / "metrics.json").read_bytes()
    (run_dir / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "seed=1"])
    assert exit_info.value.code == 2
    assert "holds a previous run (metrics.json, config.yaml" in capsys.readouterr().err
    assert (run_dir / "metrics.json").read_bytes() == before
    main([*args, "seed=1", "--overwrite"])
    assert json.loads((run_dir / "metrics.json").read_text())["seed"] == 1
    assert (run_dir / "notes.txt").read_text() == "mine"  # only the run's own outputs are replaced
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "ep1-ba22-rank0.pt",
        "latest-rank0.pt",
    ]
    # Resuming the run in its own directory continues it without --overwrite.
    main(["train", DIGITS, *QUIET, "trainer.max_duration=2ep", "evaluation.interval=null",
          f"trainer.load_path={run_dir / 'checkpoints' / 'latest-rank0.pt'}", "--run-dir", str(run_dir)])  # fmt: skip
    assert json.loads((run_dir / "metrics.json").read_text())["epochs"] == 2


def test_a_run_dir_under_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit):
        main(["train", DIGITS, *QUIET, "--run-dir", str(tmp_path / "file" / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"composer-dynsample train: error: --run-dir '{tmp_path / 'file' / 'run'}': '{tmp_path / 'file'}' is a file, not a directory."
    ]


class _Marker:
    """A pickle that creates a file when it is loaded: what a malicious checkpoint does, harmlessly."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def _broken_checkpoints(real: Path, folder: Path) -> dict[str, Path]:
    data = real.read_bytes()
    files = {"truncated": data[: len(data) // 2], "random": bytes(range(256)) * 20, "empty": b""}
    paths = {}
    for name, content in files.items():
        paths[name] = folder / f"{name}.pt"
        paths[name].write_bytes(content)
    return paths


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_crafted_checkpoint_runs_no_code_and_broken_ones_are_named(first_run, tmp_path, capsys, command):
    import torch

    run_dir, _ = first_run
    marker = tmp_path / "code-ran"
    evil = tmp_path / "evil.pt"
    torch.save({"state": {"model": _Marker(marker)}}, evil)
    cases = {"evil": evil, **_broken_checkpoints(run_dir / "checkpoints" / "latest-rank0.pt", tmp_path)}
    expected = {
        "evil": "was refused: its pickle asks for ",
        "truncated": "truncated or corrupt",
        "random": "truncated or corrupt",
        "empty": "is empty (0 bytes)",
    }
    for name, path in cases.items():
        if command == "train":
            argv = ["train", DIGITS, *QUIET, "trainer.max_duration=9ep", f"trainer.load_path={path}",
                    "--run-dir", str(tmp_path / name)]  # fmt: skip
        else:
            argv = ["eval", DIGITS, "--checkpoint", str(path), "--out", str(tmp_path / f"{name}.json")]
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_info.value.code == 2 and len(err) == 1, (name, err)
        assert str(path) in err[0] and expected[name] in err[0], (name, err[0])
    assert not marker.exists()  # nothing ran


def test_without_a_terminal_there_is_no_progress_bar(tmp_path, capfd, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    main(["train", DIGITS, "trainer.max_duration=2ep", "evaluation.interval=1ep", "--run-dir", str(tmp_path)])
    captured = capfd.readouterr()
    lines = (captured.out + captured.err).splitlines()
    assert len(lines) < 30, lines[:40]  # the table and the summary, no bar redrawn per batch
    assert not any("train          Epoch" in line or "ba/s" in line for line in lines)
    assert sum("intra-op thread" in line for line in lines) == 1  # the thread choice, said once


def test_a_refused_run_dir_stops_every_rank_of_a_launch(tmp_path):
    """Rank 0 refuses and exits; the launcher stops rank 1 rather than leaving it waiting for rank 0."""
    import socket
    import subprocess
    import sys

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.json").write_text("{}")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "composer.cli.launcher", "-n", "2", "--master_port", str(port),
               "-m", "composer_dynsample", "train", DIGITS, *QUIET, "--run-dir", str(tmp_path / "run")]  # fmt: skip
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert result.returncode != 0
    assert "holds a previous run (metrics.json)" in result.stdout + result.stderr
    assert json.loads((tmp_path / "run" / "metrics.json").read_text()) == {}


def copy_run(first_run, folder: Path) -> Path:
    """A copy of the trained run (its checkpoint symlink followed), for tests that add to a run directory."""
    import shutil

    run_dir, _ = first_run
    return Path(shutil.copytree(run_dir, folder))


def test_autoresume_continues_the_run_in_its_directory(first_run, tmp_path):
    """trainer.autoresume=true: rerunning the command continues from RUN_DIR/checkpoints/latest-rank0.pt."""
    run_dir = copy_run(first_run, tmp_path / "run")
    main(["train", DIGITS, *QUIET, "trainer.autoresume=true", "trainer.max_duration=5ep",
          "evaluation.interval=null", "--run-dir", str(run_dir)])  # fmt: skip
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert (metrics["resumed_from_epoch"], metrics["epochs"], metrics["epochs_this_run"]) == (4, 5, 1)
    assert (run_dir / "checkpoints" / "latest-rank0.pt").resolve().name.startswith("ep5-")


@pytest.mark.parametrize(
    ("argv", "detail"),
    [
        (["eval", "model.encoder.embedding_dim=16"], "size mismatch for encoder."),
        (["eval", "model.encoder.hidden_dims=[64,64]"], "Missing key(s) in state_dict"),
        (["embed", "model.encoder.embedding_dim=16"], "size mismatch for encoder."),
        (
            ["train", "model.encoder.embedding_dim=16", "trainer.max_duration=9ep"],
            "size mismatch for encoder.",
        ),
    ],
    ids=["eval", "eval-layers", "embed", "train-resume"],
)
def test_a_checkpoint_of_another_model_is_one_line(first_run, tmp_path, capsys, argv, detail):
    run_dir, _ = first_run
    checkpoint = run_dir / "checkpoints" / "latest-rank0.pt"
    command, *overrides = argv
    if command == "train":
        args = [
            command,
            DIGITS,
            *QUIET,
            *overrides,
            f"trainer.load_path={checkpoint}",
            "--run-dir",
            str(tmp_path),
        ]
    else:
        args = [
            command,
            DIGITS,
            *overrides,
            "--checkpoint",
            str(checkpoint),
            "--out",
            str(tmp_path / "out.npz"),
        ]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1, err[-5:]
    assert f"checkpoint '{checkpoint}' does not match the config's model" in err[0] and detail in err[0], err[
        0
    ]


def test_a_checkpoint_path_is_taken_as_it_is(first_run, tmp_path, capsys):
    """'#' is not a YAML comment in --checkpoint, nor a URL fragment for Composer: the checked file is loaded."""
    import shutil

    run_dir, metrics = first_run
    folder = tmp_path / "run #2"
    folder.mkdir()
    checkpoint = Path(shutil.copy(run_dir / "checkpoints" / "latest-rank0.pt", folder / "ck?.pt"))
    # A config with autoresume on still scores the --checkpoint given, not a run's latest checkpoint.
    main(["eval", DIGITS, "trainer.autoresume=true", "--checkpoint", str(checkpoint)])
    evaluated = json.loads((folder / "eval.json").read_text())
    assert evaluated["recall_at_1"] == pytest.approx(metrics["recall_at_1"], abs=1e-6)
    assert evaluated["checkpoint"] == str(checkpoint)


def test_a_home_directory_path_is_expanded_for_the_run_too(first_run, tmp_path, monkeypatch):
    """'~' in trainer.load_path and --run-dir: the file checked is the one loaded, and no './~' appears."""
    import shutil

    run_dir, _ = first_run
    home, work = tmp_path / "home", tmp_path / "work"
    (home / "ck").mkdir(parents=True)
    work.mkdir()
    shutil.copy(run_dir / "checkpoints" / "latest-rank0.pt", home / "ck" / "latest.pt")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    main(["train", DIGITS, *QUIET, "trainer.max_duration=5ep", "evaluation.interval=null",
          "trainer.load_path=~/ck/latest.pt", "--run-dir", "~/H"])  # fmt: skip
    metrics = json.loads((home / "H" / "metrics.json").read_text())
    assert (metrics["resumed_from_epoch"], metrics["epochs"]) == (4, 5)
    assert list(work.iterdir()) == []


def test_out_paths_are_what_is_written(first_run, tmp_path, capsys):
    """embed appends .npz and says so; a directory as --out is one line, and no stray file is left."""
    run_dir, _ = first_run
    checkpoint = str(run_dir / "checkpoints" / "latest-rank0.pt")
    main(["embed", DIGITS, "--checkpoint", checkpoint, "--out", str(tmp_path / "test")])
    assert f"to {tmp_path / 'test.npz'}" in capsys.readouterr().out
    assert np.load(tmp_path / "test.npz")["embeddings"].shape == (359, 32)
    folder = tmp_path / "folder"
    folder.mkdir()
    for command in ("eval", "embed"):
        with pytest.raises(SystemExit) as exit_info:
            main([command, DIGITS, "--checkpoint", checkpoint, "--out", str(folder)])
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_info.value.code == 2 and len(err) == 1, err[-5:]
        assert f"--out '{folder}' is a directory; give a file name" in err[0]
    assert list(folder.iterdir()) == [] and not (tmp_path / "folder.npz").exists()


def test_eval_draws_its_retrievals_beside_the_json_and_keeps_the_training_plot(
    first_run, tmp_path, monkeypatch
):
    """In the run directory the plot is eval-retrievals.png: the run's own retrievals.png stays train's."""
    from composer_dynsample.cli import commands

    run_dir = copy_run(first_run, tmp_path / "run")
    drawn = []
    monkeypatch.setattr(
        commands, "plot_run_retrievals", lambda run, embeddings, path, when: drawn.append(path)
    )
    main(["eval", DIGITS, "--checkpoint", str(run_dir / "checkpoints" / "latest-rank0.pt")])
    main(["eval", DIGITS, "--checkpoint", str(run_dir / "checkpoints" / "latest-rank0.pt"),
          "--out", str(tmp_path / "elsewhere" / "scores.json")])  # fmt: skip
    assert drawn == [run_dir / "eval-retrievals.png", tmp_path / "elsewhere" / "retrievals.png"]
    assert (run_dir / "eval.json").is_file() and (tmp_path / "elsewhere" / "scores.json").is_file()
