"""A checkpoint of another world size, resumed on 2 real ranks: refused mid-epoch on both ranks, no hang."""

from __future__ import annotations

import pytest
import torch
from composer.utils import dist

from composer_dynsample import SetSamplerEpoch
from tests.distributed.test_samplers_two_ranks import make_run, shared_tmp_dir

pytestmark = pytest.mark.world_size(2)


def test_a_one_rank_mid_epoch_checkpoint_is_refused_on_two_ranks():
    dist.initialize_dist("cpu")
    folder = shared_tmp_dir()
    trainer, _, _ = make_run(callbacks=[SetSamplerEpoch()], save_folder=str(folder), save_interval="5ba")
    trainer.fit()
    trainer.close()
    if dist.get_global_rank() == 0:  # as if one rank had written it
        state = torch.load(folder / "ep1-ba10-rank0.pt", weights_only=False)
        (key,) = [key for key in state["state"]["callbacks"] if "SetSamplerEpoch" in key]
        state["state"]["callbacks"][key]["world_size"] = 1
        torch.save(state, folder / "one-rank.pt")
    dist.barrier()
    resumed, _, recorder = make_run(callbacks=[SetSamplerEpoch()], load_path=str(folder / "one-rank.pt"))
    with pytest.raises(
        ValueError, match=r"written by 1 rank\(s\) in the middle of epoch 1 .* this run has 2 rank"
    ):
        resumed.fit()
    assert recorder.batches == {}
    dist.barrier()  # both ranks got here: neither waits in a collective
