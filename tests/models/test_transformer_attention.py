"""TransformerEncoder's attention kernel and torch.compile: SDPA where the model has it, eager (no error) where
it does not, the same embeddings either way; a compiled model trains a few steps as the eager one does."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

from composer_dynsample.config import load_config
from composer_dynsample.config.run import build_run
from composer_dynsample.models.transformer import TransformerEncoder
from tests.cli.helpers import pairs_data, write_tiny_pairs_config
from tests.models.folders import save_bert_folder

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TINY = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32}
BERT = {"model_type": "bert", **TINY, "max_position_embeddings": 64}


def _features(width: int = 12) -> dict[str, torch.Tensor]:
    lengths = torch.tensor([3, 12, 7, 9])
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    ids = torch.randint(5, 50, mask.shape, generator=torch.Generator().manual_seed(0)) * mask
    return {"input_ids": ids, "attention_mask": mask}


def test_a_bert_runs_sdpa_and_embeds_as_eager():
    torch.manual_seed(0)
    sdpa = TransformerEncoder(vocab_size=50, config=BERT).eval()
    torch.manual_seed(0)
    eager = TransformerEncoder(vocab_size=50, config=BERT, attn_implementation="eager").eval()
    assert (sdpa.attn_implementation, eager.attn_implementation) == ("sdpa", "eager")
    torch.testing.assert_close(sdpa(_features()), eager(_features()), atol=1e-5, rtol=1e-5)


def test_a_folder_loads_with_sdpa(tmp_path):
    folder = save_bert_folder(tmp_path / "bert")
    assert TransformerEncoder(path=folder).attn_implementation == "sdpa"
    assert TransformerEncoder(path=folder, attn_implementation="eager").attn_implementation == "eager"


@pytest.mark.parametrize("model_type", ["mpnet", "deberta-v2"])
def test_a_model_without_sdpa_falls_back_to_eager_without_error(model_type):
    encoder = TransformerEncoder(vocab_size=50, config={"model_type": model_type, **TINY})
    assert encoder.attn_implementation == "eager"
    assert encoder(_features()).shape == (4, 16)


def test_the_config_s_own_attn_implementation_wins():
    encoder = TransformerEncoder(vocab_size=50, config={**BERT, "attn_implementation": "eager"})
    assert encoder.attn_implementation == "eager"


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"attn_implementation": 3}, TypeError, "attn_implementation must be a transformers attention"),
        ({"attn_implementation": ""}, TypeError, "attn_implementation must be a transformers attention"),
        ({"attn_implementation": "fast"}, ValueError, 'attn_implementation="fast"'),
        ({"compile": "yes"}, TypeError, "compile must be true, false or a mapping"),
        ({"compile": {"modee": "default"}}, ValueError, r"compile: torch.compile takes no argument 'modee'"),
    ],
)
def test_wrong_settings_are_refused_naming_the_argument(arguments, error, message):
    with pytest.raises(error, match=message):
        TransformerEncoder(vocab_size=50, config=BERT, **arguments)


def _fit(tmp_path, *overrides: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Two steps of the tiny pairs config with a random-init BERT, dropout off (the runs draw no masks)."""
    config = {**BERT, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    model = {
        "encoder": {"name": "transformer", "config": config},
        "loss": {"name": "info_nce", "temperature": 0.1},
    }
    tmp_path.mkdir()
    path = write_tiny_pairs_config(tmp_path, pairs_data(tmp_path), model, lr=0.01)
    run = build_run(load_config(path, list(overrides)), tmp_path / "run")
    run.trainer.fit()
    return run.trainer.state.loss.detach(), {k: v.detach().clone() for k, v in run.model.state_dict().items()}


@pytest.mark.skipif(not hasattr(nn.Module, "compile"), reason="nn.Module.compile needs torch >= 2.2")
def test_a_compiled_encoder_trains_as_the_eager_one(tmp_path):
    """The ``aot_eager`` backend traces the forward and backward graphs as the default (inductor) does, in
    seconds: inductor's C++ code generation takes over a minute for this model on a CPU, so it is not run
    here (the option passes ``backend`` on to ``torch.compile`` unchanged)."""
    loss, weights = _fit(tmp_path / "eager")
    compiled_loss, compiled_weights = _fit(
        tmp_path / "compiled", "model.encoder.compile={backend: aot_eager}"
    )
    assert compiled_weights.keys() == weights.keys()  # compiled in place: checkpoints keep their keys
    torch.testing.assert_close(compiled_loss, loss, atol=1e-5, rtol=1e-5)
    for name, value in weights.items():
        torch.testing.assert_close(compiled_weights[name], value, atol=1e-5, rtol=1e-5)
