"""``--run RUN_DIR`` for eval, embed and export: the run directory's config.yaml and latest checkpoint give
what CONFIG --checkpoint CKPT gives; a run directory that lacks one, or --run beside them, is one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from composer_dynsample.cli.main import main
from tests.cli.helpers import (
    MINED,
    export_huggingface,
    latest_checkpoint,
    one_line_error,
    trained_pairs_run,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A bag-of-tokens pairs run of 2 batches: ``(folder, config, run directory)``."""
    return trained_pairs_run(tmp_path_factory.mktemp("run_option"), MINED)


def files_of(folder: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def test_export_with_run_writes_the_folder_config_and_checkpoint_write(trained, tmp_path, capsys):
    _, config, run_dir = trained
    checkpoint = latest_checkpoint(run_dir)
    main(["export", "--run", str(run_dir), "--out", str(tmp_path / "a"), "--format", "huggingface"])
    by_run = capsys.readouterr().out
    export_huggingface(config, checkpoint, tmp_path / "b")
    by_config = capsys.readouterr().out
    assert by_run.replace(str(tmp_path / "a"), "OUT") == by_config.replace(str(tmp_path / "b"), "OUT")
    assert "wrote the huggingface model of latest-rank0.pt to" in by_run, by_run
    written = files_of(tmp_path / "a")
    assert written and written == files_of(tmp_path / "b")


@pytest.mark.parametrize("source", [["--split", "train"], ["--split", "test"]])
def test_embed_with_run_writes_the_embeddings_config_and_checkpoint_write(trained, tmp_path, source):
    _, config, run_dir = trained
    main(["embed", "--run", str(run_dir), *source, "--out", str(tmp_path / "run.npz")])
    main(
        [
            "embed",
            config,
            "--checkpoint",
            latest_checkpoint(run_dir),
            *source,
            "--out",
            str(tmp_path / "c.npz"),
        ]
    )
    by_run, by_config = np.load(tmp_path / "run.npz"), np.load(tmp_path / "c.npz")
    assert sorted(by_run.files) == sorted(by_config.files)
    for name in by_run.files:
        assert np.array_equal(by_run[name], by_config[name]), name


def test_eval_with_run_scores_the_latest_checkpoint_and_takes_overrides(trained, tmp_path):
    """An override after --run is an override (argparse reads the first positional as CONFIG)."""
    _, config, run_dir = trained
    main(["eval", "--run", str(run_dir), "evaluation.ks=[1,3]", "--out", str(tmp_path / "run.json")])
    main(["eval", config, "--checkpoint", latest_checkpoint(run_dir), "evaluation.ks=[1,3]",
          "--out", str(tmp_path / "config.json")])  # fmt: skip
    by_run = json.loads((tmp_path / "run.json").read_text())
    by_config = json.loads((tmp_path / "config.json").read_text())
    assert "recall_at_3" in by_run and "recall_at_5" not in by_run
    timings = {key for key in by_run if key.endswith("_s")}
    assert {k: v for k, v in by_run.items() if k not in timings} == {
        k: v for k, v in by_config.items() if k not in timings
    }


def test_eval_with_run_writes_eval_json_in_the_run_directory(trained, tmp_path):
    _, _, run_dir = trained
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy, symlinks=True)
    main(["eval", "--run", str(copy)])
    assert json.loads((copy / "eval.json").read_text())["checkpoint"] == str(
        copy / "checkpoints" / "latest-rank0.pt"
    )


@pytest.mark.parametrize("command", ["eval", "embed", "export", "mine"])
def test_run_with_a_config_or_a_checkpoint_is_one_line(trained, tmp_path, capsys, command):
    _, config, run_dir = trained
    out = ["--out", str(tmp_path / "out.x")] if command != "eval" else []
    error = one_line_error(capsys, [command, config, "--run", str(run_dir), *out])
    assert error == (
        f"composer-dynsample {command}: error: --run '{run_dir}' reads the run's config.yaml: drop the config "
        f"'{config}', or drop --run and give CONFIG --checkpoint CKPT."
    )
    checkpoint = latest_checkpoint(run_dir)
    error = one_line_error(capsys, [command, "--run", str(run_dir), "--checkpoint", checkpoint, *out])
    assert f"--run '{run_dir}' takes the run's latest checkpoint: drop --checkpoint '{checkpoint}'" in error
    assert not (tmp_path / "out.x").exists()


def test_a_run_directory_without_its_config_or_a_checkpoint_is_one_line(trained, tmp_path, capsys):
    _, _, run_dir = trained
    bare = tmp_path / "bare"
    (bare / "checkpoints").mkdir(parents=True)
    shutil.copy(run_dir / "checkpoints" / "latest-rank0.pt", bare / "checkpoints" / "ep0-ba2-rank0.pt")
    out = ["--out", str(tmp_path / "model")]
    error = one_line_error(capsys, ["export", "--run", str(bare), *out])
    assert error == (
        f"composer-dynsample export: error: --run '{bare}' holds no config.yaml (train writes it there as it "
        "starts); give the run directory of a train run, or CONFIG --checkpoint CKPT."
    )
    (bare / "config.yaml").write_bytes((run_dir / "config.yaml").read_bytes())
    (bare / "checkpoints" / "ep0-ba2-rank0.pt").unlink()
    error = one_line_error(capsys, ["export", "--run", str(bare), *out])
    assert error == (
        f"composer-dynsample export: error: --run '{bare}' holds no checkpoint (checkpoints/*.pt): train or "
        "resume the run to save one."
    )
    error = one_line_error(capsys, ["eval", "--run", str(bare)])
    assert error.endswith(f"or give '{bare / 'config.yaml'}' without --run for the model as built."), error
    error = one_line_error(capsys, ["embed", "--run", str(tmp_path / "absent"), *out])
    assert f"--run '{tmp_path / 'absent'}': no such directory; give the run directory of a train run" in error
    assert not (tmp_path / "model").exists()


def test_a_run_directory_s_newest_checkpoint_serves_without_latest(trained, tmp_path, capsys):
    """A run directory whose latest-rank0.pt is gone: its newest checkpoint file is the one taken."""
    _, _, run_dir = trained
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy, symlinks=False)
    (copy / "checkpoints" / "latest-rank0.pt").rename(copy / "checkpoints" / "ep0-ba2-rank0.pt")
    main(["export", "--run", str(copy), "--out", str(tmp_path / "model"), "--format", "huggingface"])
    assert "model of ep0-ba2-rank0.pt to" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["embed", "--out", "x.npz"], "embed needs CONFIG.yaml --checkpoint CKPT, or --run RUN_DIR"),
        (["eval"], "eval needs CONFIG.yaml [--checkpoint CKPT], or --run RUN_DIR"),
        (
            ["export", "CONFIG.yaml", "--out", "x"],
            "export needs the model's checkpoint: add --checkpoint CKPT",
        ),
    ],
)
def test_neither_a_config_nor_a_run_is_one_line(capsys, argv, expected):
    error = one_line_error(capsys, argv)
    assert expected in error, error
