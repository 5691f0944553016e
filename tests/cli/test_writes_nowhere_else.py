"""Every command writes only into the folders it is told to write.

Each command runs as a user runs it, in an empty working folder with empty temp, home and cache folders
(one process runs them all, each in folders of its own). Once the process has ended, every new path lies in the folders the command names (the run directory,
``--out``, the config's cache folder, a converted data set's ``local`` cache) or in matplotlib's cache (its
font list): the working, temp and home folders stay empty, and no other library caches anything.
"""

from __future__ import annotations

import json
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


#: Run in a process of its own: each command of ``sys.argv[1]`` (a JSON list of ``[place, argv]``) run by
#: ``main`` in that place's fresh ``cwd``, with its ``tmp``, ``home`` and ``cache`` as the temp, home and cache
#: folders; what each created goes to ``sys.argv[2]``. One process for every command: each command's own
#: files are told apart by listing the root before and after it.
DRIVER = """
import json, os, sys, tempfile, traceback
from pathlib import Path
commands, root, report = json.loads(sys.argv[1]), Path(sys.argv[3]), {}
def paths_under(top):
    return sorted(str(Path(folder, name)) for folder, folders, files in os.walk(top) for name in folders + files)
for place, argv in commands:
    place = Path(place)
    for name in ("cwd", "tmp", "home", "cache"):
        (place / name).mkdir(parents=True)
    os.environ.update(TMPDIR=str(place / "tmp"), HOME=str(place / "home"), XDG_CACHE_HOME=str(place / "cache"))
    tempfile.tempdir = None  # the temp folder read again from TMPDIR
    os.chdir(place / "cwd")
    before, error = set(paths_under(root)), ""
    try:
        from composer_dynsample.cli.main import main  # imported by the first command, in its folders
        main(argv)
    except SystemExit as stop:
        error = "" if stop.code in (0, None) else f"exit {stop.code}"
    except BaseException:
        error = traceback.format_exc()
    report[str(place)] = {"new": sorted(set(paths_under(root)) - before), "error": error}
Path(sys.argv[2]).write_text(json.dumps(report))
"""


class Sandbox:
    """A root folder for the data and outputs of every command; the commands, then one process running them."""

    def __init__(self, root: Path) -> None:
        self.root, self.commands, self.report = root, [], {}

    def add(self, *argv: str, writes: list[Path]) -> Path:
        """Queue ``composer-dynsample ARGV``, which may create paths only inside ``writes`` and matplotlib's
        cache; its place (``process-N-COMMAND``, holding its fresh ``cwd``, ``tmp``, ``home`` and ``cache``)."""
        place = self.root / f"process-{len(self.commands) + 1}-{argv[0]}"
        self.commands.append((place, list(argv), writes))
        return place

    def run_all(self) -> None:
        env = {key: value for key, value in os.environ.items() if key not in PLACES}
        listing = json.dumps([[str(place), argv] for place, argv, _ in self.commands])
        out = self.root / "report.json"
        done = subprocess.run(
            [sys.executable, "-c", DRIVER, listing, str(out), str(self.root)],
            env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        self.report = json.loads(out.read_text())

    def new(self, place: Path) -> list[Path]:
        """What the command of ``place`` created, checked: it succeeded and wrote nowhere else."""
        (_, argv, writes), record = next(c for c in self.commands if c[0] == place), self.report[str(place)]
        assert not record["error"], record["error"]
        # What the process removed as it exited (torch's and Composer's temporary folders) is not left behind.
        new = [Path(path) for path in record["new"] if os.path.lexists(path)]
        allowed = [*writes, place / "cache" / "matplotlib"]
        stray = [str(path.relative_to(self.root)) for path in new if not inside(path, allowed)]
        assert not stray, f"{argv[0]} wrote outside {[str(w) for w in writes]}: {stray}"
        return new


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Sandbox:
    """Every command, run once: a bag-of-tokens pairs run of 2 batches with an embedding table (``train``),
    ``eval``, ``embed``, ``mine`` and ``export`` of it, ``train`` on an image folder, and ``convert`` of the
    pairs with a ``train`` on the shards."""
    box = Sandbox(tmp_path_factory.mktemp("writes"))
    data, run_dir = box.root / "data", box.root / "run"
    data.mkdir()
    write_pairs(data)
    config = write_bag_pairs_config(data, SAMPLER, algorithms={"embedding_table": {}})
    box.places = {"train": box.add("train", config, "trainer.max_duration=2ba", "--run-dir", str(run_dir),
                                   writes=[run_dir, data / "cache"])}  # fmt: skip
    box.places["eval"] = box.add(
        "eval", "--run", str(run_dir), writes=[run_dir / "eval.json", data / "cache"]
    )
    for command, name in (("embed", "test.npz"), ("mine", "triplets.jsonl"), ("export", "model")):
        options = (
            ["--format", "huggingface"] if command == "export" else []
        )  # a bag of tokens is no transformer
        argv = [command, "--run", str(run_dir), "--out", str(box.root / name), *options]
        box.places[command] = box.add(
            *argv, writes=[box.root / name, data / "cache"]
        )  # export caches there too
    images = box.root / "images"
    write_colour_folder(images / "flat", COLOURS)
    image_config = write_image_config(images, {"path": str(images / "flat")})
    box.places["image"] = box.add("train", image_config, "--run-dir", str(box.root / "image-run"),
                                  writes=[box.root / "image-run"])  # fmt: skip
    shards = box.root / "mds"
    box.places["convert"] = box.add("convert", config, "--to", "mds", str(shards), writes=[shards])
    cached = box.root / f"process-{len(box.commands) + 1}-train" / "cache" / "composer_dynsample"
    argv = ["train", config, f"data={{name: streaming, remote: '{shards}'}}", "trainer.max_duration=2ba"]
    box.places["shards"] = box.add(*argv, "--run-dir", str(box.root / "shards-run"),
                                   writes=[box.root / "shards-run", cached])  # fmt: skip
    box.cached = cached
    box.run_all()
    return box


def test_train_on_pairs_writes_its_run_and_its_data_cache(sandbox):
    sandbox.new(sandbox.places["train"])
    run_dir, data = sandbox.root / "run", sandbox.root / "data"
    assert (run_dir / "checkpoints" / "latest-rank0.pt").is_file() and any((data / "cache").iterdir())


def test_train_on_an_image_folder_writes_its_run(sandbox):
    sandbox.new(sandbox.places["image"])
    assert (sandbox.root / "image-run" / "metrics.json").is_file()


def test_eval_run_writes_its_figures_into_the_run(sandbox):
    assert sandbox.root / "run" / "eval.json" in sandbox.new(sandbox.places["eval"])


@pytest.mark.parametrize("command", ["embed", "mine", "export"])
def test_a_command_of_a_run_writes_its_out(sandbox, command):
    out = sandbox.root / {"embed": "test.npz", "mine": "triplets.jsonl", "export": "model"}[command]
    assert out in sandbox.new(sandbox.places[command])


def test_train_on_converted_shards_leaves_no_lock_in_the_temp_folder(sandbox):
    """Without ``local`` the shards are cached in the user's cache folder; Streaming's lock files, made in
    the temp folder while the run reads the shards, are gone once its process has ended."""
    sandbox.new(sandbox.places["convert"])
    sandbox.new(sandbox.places["shards"])
    (local,) = (sandbox.cached / "streaming").iterdir()
    assert list((local / "train").glob("shard.*"))
    temp = sandbox.places["shards"] / "tmp"
    made = [Path(path).name for path in sandbox.report[str(sandbox.places["shards"])]["new"]]
    assert any(name.endswith("_cache_filelock") for name in made) and not list(temp.iterdir()), made


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
