"""Values that used to fail late, with a traceback, are one line of ``train`` before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from composer_dynsample.cli.main import main

DIGITS = str(Path(__file__).resolve().parents[2] / "yamls" / "digits_quick.yaml")
TRAIN = ["train", DIGITS, "trainer.max_duration=1ep", "evaluation.interval=null", "--quiet"]


@pytest.mark.filterwarnings("error::FutureWarning")  # OmegaConf's warning of an int put in a float field
@pytest.mark.parametrize(
    ("override", "message"),
    [
        # A YAML parser traceback of 37 lines.
        ("model.encoder={unclosed", "override 'model.encoder={unclosed': the value is not valid YAML ("),
        # An OverflowError from numpy, deep in the sampler.
        (
            "sampler.samples_per_class=1000000000000000000000000000000",
            "sampler.samples_per_class must be an integer in [-2**63, 2**63 - 1] (64 bits), got 1" + "0" * 30,
        ),
        (
            "evaluation.ks=[1, 100000000000000000000000]",
            "evaluation.ks[1] must be an integer in [-2**63, 2**63 - 1]",
        ),
        # A bare AssertionError once the first worker started, after config.yaml was written.
        ("dataloader.prefetch_factor=0", "dataloader.prefetch_factor must be an integer >= 1, got 0."),
        ("dataloader.timeout=-1", "dataloader.timeout must be a number of seconds >= 0, got -1.0."),
    ],
)
def test_malformed_values_are_one_line_and_write_nothing(tmp_path, capsys, override, message):
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        main([*TRAIN, "dataloader.num_workers=1", override, "--run-dir", str(run_dir)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and message in err[0], err
    assert not run_dir.exists()
