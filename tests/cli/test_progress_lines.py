"""``train`` with stdout not a terminal (a log file; capsys here) prints a plain progress line now and
then: the step of the run's total, the epoch, the loss, the speed and the time left, and one at the end."""

from __future__ import annotations

import re
import sys

import pytest

pytest.importorskip("tokenizers")

from composer_dynsample.cli.main import main
from tests.cli.helpers import latest_checkpoint, one_line_error, write_bag_pairs_config, write_pairs

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

PK = {"name": "pk", "classes_per_batch": 8, "samples_per_class": 2}  # 32 pairs: 4 batches an epoch
LINE = re.compile(
    r"step (\d+)/(\d+) \(epoch (\d+)\) loss (-?\d+\.\d{4}) ([\d.]+) steps/s, (\d+s|\d+m\d\ds) left"
)
LAST = re.compile(
    r"step (\d+)/(\d+) \((?:end of )?epoch \d+\) loss -?\d+\.\d{4} [\d.]+ steps/s, done in (?:\d+s|\d+m\d\ds)"
)
EVERY_2 = "callbacks.progress_lines={every_batches: 2, every_seconds: null}"


@pytest.fixture
def config(tmp_path):
    write_pairs(tmp_path)
    return write_bag_pairs_config(tmp_path, PK)


def _progress(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("step ")]


def test_a_run_without_a_terminal_prints_a_line_per_tenth_and_one_at_the_end(config, tmp_path, capsys):
    main(["train", config, "trainer.max_duration=2ep", "--run-dir", str(tmp_path / "run")])
    *lines, last = _progress(capsys.readouterr().out)
    matches = [LINE.fullmatch(line) for line in lines]
    assert all(matches), lines
    # 8 batches: a tenth rounds up to every batch; the last one is the end's line.
    assert [(int(m[1]), int(m[2]), int(m[3])) for m in matches] == [
        (step, 8, (step - 1) // 4) for step in range(1, 8)
    ]
    assert LAST.fullmatch(last) and last.startswith("step 8/8 (end of epoch 1) loss "), last


def test_quiet_prints_no_progress_line_not_even_a_configured_one(config, tmp_path, capsys):
    main(["train", config, "--quiet", "--run-dir", str(tmp_path / "a")])
    main(["train", config, EVERY_2, "--quiet", "--run-dir", str(tmp_path / "b")])
    assert _progress(capsys.readouterr().out) == []


def test_the_configured_interval_is_kept_and_a_resume_counts_on(config, tmp_path, capsys):
    main(["train", config, "trainer.max_duration=7ba", EVERY_2, "--run-dir", str(tmp_path / "run")])
    lines = _progress(capsys.readouterr().out)
    assert [line.split(" (")[0] for line in lines] == ["step 2/7", "step 4/7", "step 6/7", "step 7/7"]
    assert LAST.fullmatch(lines[-1]), lines
    load = f"trainer.load_path={latest_checkpoint(tmp_path / 'run')}"
    main(["train", config, "trainer.max_duration=12ba", EVERY_2, load, "--run-dir", str(tmp_path / "more")])
    lines = _progress(capsys.readouterr().out)
    assert [line.split(" (")[0] for line in lines] == ["step 8/12", "step 10/12", "step 12/12"], lines
    assert LINE.fullmatch(lines[0])[3] == "1" and lines[-1].startswith("step 12/12 (end of epoch 2) ")


def test_null_turns_them_off_and_a_terminal_gets_none(config, tmp_path, capsys, monkeypatch):
    main(["train", config, "callbacks.progress_lines=null", "--run-dir", str(tmp_path / "off")])
    assert _progress(capsys.readouterr().out) == []
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    main(["train", config, "trainer.progress_bar=false", "--run-dir", str(tmp_path / "terminal")])
    assert _progress(capsys.readouterr().out) == []


def test_a_wrong_interval_is_one_line(config, tmp_path, capsys):
    wrong = "callbacks.progress_lines={every_batches: 0}"
    error = one_line_error(capsys, ["train", config, wrong, "--run-dir", str(tmp_path / "run")])
    assert "every_batches must be an integer >= 1, got 0." in error, error


def test_the_lines_read_no_tensor_on_the_host(config, tmp_path, capsys):
    """The loss printed is the one Composer has already read for its logs: a line costs no device sync."""
    from composer_dynsample.testing import HostReadCounter

    every = "callbacks.progress_lines={every_batches: 1, every_seconds: null}"
    with HostReadCounter() as counter:
        main(["train", config, "trainer.max_duration=5ba", every, "--run-dir", str(tmp_path / "run")])
    assert len(_progress(capsys.readouterr().out)) == 5
    assert counter.total() > 0  # the counter saw Composer's own reads
    assert [site for _, site, _ in counter.sites if "progress_lines" in site] == []


def test_a_checkpoint_without_them_resumes_with_them_without_a_warning(config, tmp_path, capsys, recwarn):
    main(["train", config, "trainer.max_duration=2ba", "--quiet", "--run-dir", str(tmp_path / "run")])
    load = f"trainer.load_path={latest_checkpoint(tmp_path / 'run')}"
    main(["train", config, "trainer.max_duration=6ba", EVERY_2, load, "--run-dir", str(tmp_path / "more")])
    assert [line.split(" (")[0] for line in _progress(capsys.readouterr().out)] == ["step 4/6", "step 6/6"]
    assert [str(w.message) for w in recwarn if "ProgressLines" in str(w.message)] == []
