"""Every pooling mode of sentence-transformers: ``pool_tokens`` against its ``Pooling`` module (right and
left padding, prompts left out), ``TransformerEncoder`` of a folder in each mode against
``SentenceTransformer.encode``, and an export that keeps the mode."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers")

import sentence_transformers
from sentence_transformers import models

from composer_dynsample import EmbeddingModel
from composer_dynsample.export import export_sentence_transformers
from composer_dynsample.models.pooling import POOLING_MODES, pool_tokens, pooling_modes
from composer_dynsample.models.sentence_folder import read_model_folder
from composer_dynsample.models.text import TwoTowerEncoder
from composer_dynsample.models.tokens import length_groups
from composer_dynsample.models.transformer import TransformerEncoder, folder_pooling
from composer_dynsample.validation import InputTypeError
from tests.models.folders import save_sentence_folder
from tests.models.text_helpers import TOKENIZER, bert_config, features, transformer

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

COMBINED = ("mean+max", "max+mean", "cls+mean+lasttoken", "mean_sqrt_len_tokens+weightedmean+max")
MODES = (*POOLING_MODES, *COMBINED)
LENGTHS = [9, 5, 3, 2, 7]
TEXTS = [
    "how do i sort a list",
    "capital of france",
    "sorted returns a new sorted list of every item that the list held before",
    "cats eat fish and mice",
    "x",
]
PROMPT = "query: "


def _reference(mode: str, include_prompt: bool = True) -> torch.nn.Module:
    modes = tuple(mode.split("+"))
    return models.Pooling(6, modes[0] if len(modes) == 1 else modes, include_prompt=include_prompt)


def _theirs(hidden, mask, mode, prompt_length: int | None = None) -> torch.Tensor:
    """sentence-transformers' pooling (its prompt length is one int for the batch)."""
    values = {"token_embeddings": hidden, "attention_mask": mask}
    if prompt_length is not None:
        values["prompt_length"] = prompt_length
    return _reference(mode, include_prompt=prompt_length is None)(values)["sentence_embedding"]


def _mask(padding: str, width: int = 9) -> torch.Tensor:
    right = (torch.arange(width)[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    return right if padding == "right" else right.flip(1)


def _hidden(width: int = 9) -> torch.Tensor:
    return torch.randn(len(LENGTHS), width, 6, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.parametrize("mode", MODES)
def test_each_mode_pools_as_sentence_transformers(mode, padding):
    hidden, mask = _hidden(), _mask(padding)
    ours = pool_tokens(hidden, mask, mode)
    assert ours.shape == (len(LENGTHS), 6 * len(mode.split("+")))
    torch.testing.assert_close(ours, _theirs(hidden, mask, mode), atol=1e-6, rtol=0)
    torch.testing.assert_close(pool_tokens(hidden, mask.bool(), mode), ours, atol=1e-6, rtol=0)


def test_the_last_token_is_found_from_the_mask_on_either_side():
    hidden = _hidden()
    lengths = torch.tensor(LENGTHS)
    rows = torch.arange(len(LENGTHS))
    right = pool_tokens(hidden, _mask("right"), "lasttoken")
    torch.testing.assert_close(right, hidden[rows, lengths - 1], atol=0, rtol=0)
    left = pool_tokens(hidden, _mask("left"), "lasttoken")
    torch.testing.assert_close(left, hidden[:, -1], atol=0, rtol=0)
    cls = pool_tokens(hidden, _mask("left"), "cls")  # the first attended token, after the padding
    torch.testing.assert_close(cls, hidden[rows, 9 - lengths], atol=0, rtol=0)


@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.parametrize("mode", MODES)
def test_include_prompt_false_leaves_the_prompt_out_as_sentence_transformers(mode, padding):
    hidden, mask = _hidden(), _mask(padding)
    same = pool_tokens(hidden, mask, mode, prompt_length=torch.full((len(LENGTHS),), 1))
    torch.testing.assert_close(same, _theirs(hidden, mask, mode, prompt_length=1), atol=1e-6, rtol=0)
    # One prompt length per row: each row as sentence-transformers pools it with that length.
    lengths = [3, 2, 1, 0, 6]  # shorter than each row (sentence-transformers' max of no token is -inf)
    ours = pool_tokens(hidden, mask, mode, prompt_length=torch.tensor(lengths))
    for row, length in enumerate(lengths):
        theirs = _theirs(hidden[row : row + 1], mask[row : row + 1], mode, prompt_length=length)
        torch.testing.assert_close(ours[row : row + 1], theirs, atol=1e-6, rtol=0)
    if mode != "lasttoken":  # the last token is the text's, whatever the prompt
        assert not torch.allclose(ours[0], pool_tokens(hidden, mask, mode)[0])  # the prompt did count


def test_a_row_whose_prompt_fills_it_pools_to_zeros_where_sentence_transformers_does():
    hidden, mask = _hidden(), _mask("right")
    prompt = torch.tensor(LENGTHS)  # every token is the prompt's
    for mode in ("mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken", "cls"):
        ours = pool_tokens(hidden, mask, mode, prompt_length=prompt)
        torch.testing.assert_close(ours[:1], _theirs(hidden[:1], mask[:1], mode, 9), atol=1e-6, rtol=0)
    assert pool_tokens(hidden, mask, "max", prompt_length=prompt).eq(0).all()  # theirs: -inf


def test_an_unknown_mode_is_one_line_naming_the_key_and_the_modes():
    for bad in ("avg", "mean+", "", "mean+avg", 3, None):
        with pytest.raises(
            ValueError, match=r"^model\.encoder\.pooling must be one of \('cls', 'max'"
        ) as error:
            pooling_modes(bad, "model.encoder.pooling")
        assert "\n" not in str(error.value) and "joined by '+'" in str(error.value)
    assert pooling_modes(["mean", "max"]) == ("mean", "max")
    with pytest.raises(ValueError, match="pooling must be one of"):
        TransformerEncoder(vocab_size=10, config=bert_config(), pooling="avg")


def test_the_encoder_pools_every_mode_and_concatenates_several():
    encoder = transformer(pooling="mean+max").eval()
    batch = features(TEXTS)
    assert (encoder.embedding_dim, encoder.pooling, encoder.include_prompt) == (32, "mean+max", True)
    with torch.no_grad():
        hidden = encoder.model(**{k: batch[k] for k in ("input_ids", "attention_mask")}).last_hidden_state
        embeddings = encoder(batch)
    expected = _reference("mean+max")({"token_embeddings": hidden, "attention_mask": batch["attention_mask"]})
    torch.testing.assert_close(embeddings, expected["sentence_embedding"], atol=1e-6, rtol=0)
    assert transformer(pooling="lasttoken", embedding_dim=5).projection.in_features == 16
    assert transformer(pooling="cls+max+mean", embedding_dim=5).projection.in_features == 48


@pytest.mark.parametrize("trim_padding", [True, False])
def test_prompt_length_follows_the_rows_into_their_width_groups(trim_padding):
    """Short and long rows run apart (``trim_padding``); each row keeps its own prompt length."""
    encoder = transformer(pooling="mean+cls", include_prompt=False, trim_padding=trim_padding).eval()
    texts = [TEXTS[4], TEXTS[2], TEXTS[1], TEXTS[2], TEXTS[4], TEXTS[2]]
    batch = features(texts)
    prompt = torch.tensor([1, 3, 2, 0, 2, 5])
    assert length_groups(batch["attention_mask"]) is not None  # the grouped path runs with trim_padding
    with torch.no_grad():
        ours = encoder({**batch, "prompt_length": prompt})
        whole = encoder.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        told = encoder({**batch, "prompt_length": torch.zeros(6, dtype=torch.long)})
        plain = encoder(batch)
    expected = pool_tokens(whole.last_hidden_state, batch["attention_mask"], "mean+cls", prompt_length=prompt)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(told, plain, atol=0, rtol=0)  # 0 or absent: nothing left out
    kept = transformer(pooling="mean", trim_padding=trim_padding).eval()  # include_prompt: True
    with torch.no_grad():
        torch.testing.assert_close(kept({**batch, "prompt_length": prompt}), kept(batch), atol=0, rtol=0)


def test_prompt_length_follows_the_rows_into_chunks_and_towers():
    """``EmbeddingModel(forward_chunk_size=...)`` and ``TwoTowerEncoder`` split every (B,) feature by row."""
    encoder = transformer(pooling="weightedmean", include_prompt=False).eval()
    batch = {
        **features(TEXTS, is_query=[True, False, True, False, False]),
        "prompt_length": torch.tensor([2, 1, 0, 3, 1]),
    }
    with torch.no_grad():
        whole = encoder(batch)
        chunked = EmbeddingModel(encoder, normalize=False, forward_chunk_size=2).eval().embed(batch)
        towers = TwoTowerEncoder(encoder, encoder).eval()(batch)
    torch.testing.assert_close(chunked, whole, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(towers, whole, atol=1e-6, rtol=1e-6)


def test_a_malformed_prompt_length_is_one_line():
    encoder = transformer()
    batch = features(TEXTS)
    for bad in (torch.ones(5), torch.ones(4, dtype=torch.long), torch.ones(5, 1, dtype=torch.long), 3):
        with pytest.raises(InputTypeError, match=r"prompt_length must be a \(5,\) integer tensor"):
            encoder({**batch, "prompt_length": bad})


def test_a_left_padded_batch_pools_its_last_tokens():
    """Left padding (a decoder's tokenizer): the encoder finds each row's last token from the mask."""
    encoder = transformer(pooling="lasttoken+cls").eval()
    right = features(TEXTS)
    lengths = right["attention_mask"].sum(1)
    shift = right["attention_mask"].shape[1] - lengths
    left = {key: right[key].clone() for key in ("input_ids", "attention_mask")}
    for row, by in enumerate(shift.tolist()):
        left["input_ids"][row] = right["input_ids"][row].roll(by)
        left["attention_mask"][row] = right["attention_mask"][row].roll(by)
    with torch.no_grad():
        hidden = encoder.model(**left).last_hidden_state
        ours = encoder(left)
    theirs = _reference("lasttoken+cls")(
        {"token_embeddings": hidden, "attention_mask": left["attention_mask"]}
    )
    torch.testing.assert_close(ours, theirs["sentence_embedding"], atol=1e-6, rtol=0)
    torch.testing.assert_close(ours[:, :16], hidden[:, -1], atol=0, rtol=0)


# End to end: a sentence-transformers folder in each mode against SentenceTransformer.encode.


@pytest.fixture(scope="module")
def base_folder(tmp_path_factory) -> Path:
    return save_sentence_folder(tmp_path_factory.mktemp("pooling") / "st", pooling="mean", normalize=False)


def _folder_in(base: Path, where: Path, mode: str, include_prompt: bool = True) -> Path:
    """A copy of ``base`` whose Pooling module sentence-transformers saved in ``mode``."""
    folder = shutil.copytree(base, where)
    modes = tuple(mode.split("+"))
    pooling = models.Pooling(16, modes[0] if len(modes) == 1 else modes, include_prompt=include_prompt)
    (folder / "1_Pooling" / "config.json").unlink()
    pooling.save(str(folder / "1_Pooling"))
    return folder


def _tokens(folder: Path, texts: list[str]) -> dict[str, torch.Tensor]:
    """The texts as the data path gives them: the folder's tokenizer, cut at its max_seq_length, right-padded."""
    import tokenizers

    tokenizer = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_truncation(read_model_folder(folder).max_seq_length)
    encodings = [tokenizer.encode(text).ids for text in texts]
    width = max(len(ids) for ids in encodings)
    ids = torch.zeros(len(texts), width, dtype=torch.long)
    mask = torch.zeros(len(texts), width, dtype=torch.long)
    for row, row_ids in enumerate(encodings):
        ids[row, : len(row_ids)], mask[row, : len(row_ids)] = torch.tensor(row_ids), 1
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("mode", MODES)
def test_a_folder_in_each_mode_embeds_as_sentence_transformers(base_folder, tmp_path, mode):
    folder = _folder_in(base_folder, tmp_path / "st", mode)
    encoder = TransformerEncoder(path=folder).eval()
    assert encoder.pooling == mode and folder_pooling(read_model_folder(folder)) == mode
    with torch.no_grad():
        ours = encoder(_tokens(folder, TEXTS))
    reference = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    theirs = reference.encode(TEXTS, convert_to_tensor=True)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["mean", "cls", "lasttoken", "weightedmean+max"])
def test_a_folder_that_leaves_the_prompt_out_embeds_as_sentence_transformers(base_folder, tmp_path, mode):
    folder = _folder_in(base_folder, tmp_path / "st", mode, include_prompt=False)
    encoder = TransformerEncoder(path=folder).eval()
    assert encoder.include_prompt is False and read_model_folder(folder).include_prompt is False
    import tokenizers

    prompt_ids = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json")).encode(PROMPT).ids
    prompt_length = len(prompt_ids) - 1  # [CLS] and the prompt's tokens, less its [SEP]
    batch = _tokens(folder, [PROMPT + text for text in TEXTS])
    batch["prompt_length"] = torch.full((len(TEXTS),), prompt_length)
    with torch.no_grad():
        ours = encoder(batch)
        with_prompt = TransformerEncoder(path=folder, include_prompt=True).eval()(batch)
    reference = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    theirs = reference.encode(TEXTS, prompt=PROMPT, convert_to_tensor=True)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    assert torch.allclose(with_prompt, theirs, atol=1e-3) is (mode == "lasttoken")  # the prompt left out


def test_a_left_padding_folder_pools_the_last_token_of_each_text(base_folder, tmp_path):
    """Its tokenizer pads on the left; the data path pads on the right: the same last tokens either way."""
    folder = _folder_in(base_folder, tmp_path / "st", "lasttoken")
    config = folder / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "padding_side": "left"}))
    encoder = TransformerEncoder(path=folder).eval()
    reference = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    assert reference.tokenizer.padding_side == "left"
    left = reference.tokenize(TEXTS)
    assert (left["attention_mask"][:, 0] == 0).any()  # padded on the left
    with torch.no_grad():
        ours_left = encoder({key: left[key] for key in ("input_ids", "attention_mask")})
        ours_right = encoder(_tokens(folder, TEXTS))
    torch.testing.assert_close(
        ours_left, reference.encode(TEXTS, convert_to_tensor=True), atol=1e-5, rtol=1e-5
    )
    one_by_one = torch.stack([reference.encode(text, convert_to_tensor=True) for text in TEXTS])
    torch.testing.assert_close(ours_right, one_by_one, atol=1e-5, rtol=1e-5)  # no padding at all


@pytest.mark.parametrize(
    ("pooling", "include_prompt", "embedding_dim"),
    [("max", True, None), ("cls+mean+lasttoken", False, 6)],
    ids=["max", "combined-without-prompt-projected"],
)
def test_an_export_keeps_the_pooling(tmp_path, pooling, include_prompt, embedding_dim):
    encoder = transformer(pooling=pooling, include_prompt=include_prompt, embedding_dim=embedding_dim).eval()
    out = export_sentence_transformers(encoder, TOKENIZER, tmp_path / "st", normalize=False)
    written = json.loads((out / "1_Pooling" / "config.json").read_text())
    modes = pooling.split("+")
    assert written["pooling_mode"] == (modes[0] if len(modes) == 1 else modes)
    assert written["include_prompt"] is include_prompt
    folder = read_model_folder(out)
    assert (folder.pooling, folder.include_prompt) == (pooling, include_prompt)
    loaded = sentence_transformers.SentenceTransformer(str(out), device="cpu")
    module = loaded[1]
    assert (
        tuple(pooling_modes(module.pooling_mode)) == tuple(modes) and module.include_prompt is include_prompt
    )
    batch = features(TEXTS)
    with torch.no_grad():
        ours = encoder(batch)
    torch.testing.assert_close(loaded.encode(TEXTS, convert_to_tensor=True), ours, atol=1e-5, rtol=1e-5)
    again = TransformerEncoder(path=out)
    assert (again.pooling, again.include_prompt) == (pooling, include_prompt)
