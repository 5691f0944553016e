"""Every command writes only into the folders it is told to write.

Each command runs as a user runs it: a process of its own in an empty working folder, with empty temp, home
and cache folders. Afterwards every new path lies in the folders the command names (the run directory,
``--out``, the config's cache folder, a converted data set's ``local`` cache) or in matplotlib's cache (its
font list): the working, temp and home folders stay empty, and no other library caches anything.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")

from composer_dynsample.cli.user_folders import matplotlib_config_in_cache
from tests.cli.helpers import (
    COLOURS,
    MINED,
    write_bag_pairs_config,
    write_colour_folder,
    write_image_config,
    write_pairs,
)

SAMPLER = {**MINED, "pairs_per_batch": 4, "negatives_per_anchor": 2, "window": 4}
#: Variables that would send a library's files elsewhere than the home, temp and cache folders a run gets.
PLACES = ("HF_HOME", "HF_DATASETS_CACHE", "TRANSFORMERS_CACHE", "TORCH_HOME", "WANDB_DIR", "MPLCONFIGDIR",
          "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "COMPOSER_DYNSAMPLE_CACHE", "TRITON_CACHE_DIR")  # fmt: skip


def paths_under(root: Path) -> set[Path]:
    return {Path(folder, name) for folder, folders, files in os.walk(root) for name in folders + files}


def inside(path: Path, folders: list[Path]) -> bool:
    return any(path == folder or folder in path.parents for folder in folders)


class Sandbox:
    """A root folder for the data and outputs of every command, and the runner of one command in it."""

    def __init__(self, root: Path) -> None:
        self.root, self.count = root, 0

    def run(self, *argv: str, writes: list[Path]) -> list[Path]:
        """``composer-dynsample ARGV`` in fresh empty working, temp, home and cache folders
        (``process-N-COMMAND/{cwd,tmp,home,cache}``): it must succeed and create paths only inside ``writes``
        and matplotlib's cache. The new paths."""
        self.count += 1
        place = self.root / f"process-{self.count}-{argv[0]}"
        folders = {name: place / name for name in ("cwd", "tmp", "home", "cache")}
        for folder in folders.values():
            folder.mkdir(parents=True)
        env = {key: value for key, value in os.environ.items() if key not in PLACES}
        env.update(TMPDIR=str(folders["tmp"]), HOME=str(folders["home"]))
        env["XDG_CACHE_HOME"] = str(folders["cache"])
        before = paths_under(self.root)
        done = subprocess.run(
            [sys.executable, "-m", "composer_dynsample", *argv],
            cwd=folders["cwd"], env=env, capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        new = sorted(paths_under(self.root) - before)
        allowed = [*writes, folders["cache"] / "matplotlib"]
        stray = [str(path.relative_to(self.root)) for path in new if not inside(path, allowed)]
        assert not stray, f"{argv[0]} wrote outside {[str(w) for w in writes]}: {stray}"
        return new


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Sandbox:
    return Sandbox(tmp_path_factory.mktemp("writes"))


@pytest.fixture(scope="module")
def trained(sandbox) -> tuple[Path, Path]:
    """``train`` of a bag-of-tokens pairs run of 2 batches with an embedding table, checked by
    :meth:`Sandbox.run`: ``(data folder, run directory)``."""
    data = sandbox.root / "data"
    data.mkdir()
    write_pairs(data)
    config = write_bag_pairs_config(data, SAMPLER, algorithms={"embedding_table": {}})
    run_dir = sandbox.root / "run"
    argv = ["train", config, "trainer.max_duration=2ba", "--run-dir", str(run_dir)]
    sandbox.run(*argv, writes=[run_dir, data / "cache"])
    return data, run_dir


def test_train_on_pairs_writes_its_run_and_its_data_cache(trained):
    data, run_dir = trained
    assert (run_dir / "checkpoints" / "latest-rank0.pt").is_file() and any((data / "cache").iterdir())


def test_train_on_an_image_folder_writes_its_run(sandbox):
    images = sandbox.root / "images"
    write_colour_folder(images / "flat", COLOURS)
    config = write_image_config(images, {"path": str(images / "flat")})
    run_dir = sandbox.root / "image-run"
    sandbox.run("train", config, "--run-dir", str(run_dir), writes=[run_dir])
    assert (run_dir / "metrics.json").is_file()


def test_eval_run_writes_its_figures_into_the_run(sandbox, trained):
    data, run_dir = trained
    new = sandbox.run("eval", "--run", str(run_dir), writes=[run_dir / "eval.json", data / "cache"])
    assert run_dir / "eval.json" in new


@pytest.mark.parametrize("command", ["embed", "mine", "export"])
def test_a_command_of_a_run_writes_its_out(sandbox, trained, command):
    data, run_dir = trained
    out = sandbox.root / {"embed": "test.npz", "mine": "triplets.jsonl", "export": "model"}[command]
    options = ["--format", "huggingface"] if command == "export" else []  # a bag of tokens is no transformer
    argv = [command, "--run", str(run_dir), "--out", str(out), *options]
    new = sandbox.run(*argv, writes=[out, data / "cache"])  # export caches an empty token store there
    assert out in new


def test_train_on_converted_shards_keeps_its_locks_in_the_cache(sandbox, trained):
    """Without ``local`` the shards are cached in the user's cache folder; the locks of the cache's splits
    are there too, and the temp folder stays empty."""
    data, _ = trained
    shards = sandbox.root / "mds"
    sandbox.run("convert", str(data / "pairs.yaml"), "--to", "mds", str(shards), writes=[shards])
    run_dir = sandbox.root / "shards-run"
    cached = sandbox.root / f"process-{sandbox.count + 1}-train" / "cache" / "composer_dynsample"
    argv = ["train", str(data / "pairs.yaml"), f"data={{name: streaming, remote: '{shards}'}}"]
    sandbox.run(*argv, "trainer.max_duration=2ba", "--run-dir", str(run_dir), writes=[run_dir, cached])
    (local,) = (cached / "streaming").iterdir()
    assert (local / "train" / "cache_filelock").is_file() and list((local / "train").glob("shard.*"))


def test_matplotlib_s_config_folder_is_the_cache_only_when_the_user_has_none(tmp_path, monkeypatch):
    if not sys.platform.startswith("linux"):
        pytest.skip("matplotlib follows the XDG folders on Linux")
    for name in ("MPLCONFIGDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert matplotlib_config_in_cache() == str(tmp_path / ".cache" / "matplotlib")
    assert os.environ["MPLCONFIGDIR"] == str(tmp_path / ".cache" / "matplotlib")
    assert matplotlib_config_in_cache() is None  # a user's MPLCONFIGDIR is kept
    monkeypatch.delenv("MPLCONFIGDIR")
    (tmp_path / "settings" / "matplotlib").mkdir(parents=True)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "settings"))
    assert matplotlib_config_in_cache() is None and "MPLCONFIGDIR" not in os.environ
    assert sorted(path.name for path in tmp_path.iterdir()) == ["settings"]  # nothing made
