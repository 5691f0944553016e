"""The tokenizer of the text loaders: a local one, loaded, or a new one trained on the training split.

:func:`resolve_tokenizer` is what the loaders call. Given a path, it loads (and never downloads):

* a ``tokenizer.json`` file (Hugging Face ``tokenizers``' format) with ``Tokenizer.from_file``;
* a model folder with ``transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)``,
  which must give a fast tokenizer (one backed by ``tokenizers``).

A name that is not an existing path (a hub name such as ``bert-base-uncased``) is refused, and so is
a tokenizer whose vocabulary holds only special tokens: ``AutoTokenizer`` given a model folder with a
``config.json`` but no vocabulary file builds one of five tokens that encodes every word as ``[UNK]``.
(A vocabulary that misses most words of the data is refused once the data is tokenized, by
:func:`~composer_dynsample.data.text._sources.tokenize_sources`.)

Without a path it trains a tokenizer on the training split's texts (:func:`train_tokenizer`):
``"wordpiece"`` (BERT's scheme, ``##`` marks a word's continuation) or ``"bpe"``, with ``[PAD]`` = 0,
``[UNK]`` = 1, ``[CLS]`` = 2, ``[SEP]`` = 3, ``[MASK]`` = 4, NFKC normalisation, optional lower-casing,
BERT's pre-tokenizer (whitespace and punctuation split) and ``[CLS] text [SEP]`` around every text. It
learns from each text's first 100,000 characters, more than the model is shown of a text at any usual
``max_length`` (see :mod:`~composer_dynsample.data.text.truncation`), so one huge line (a minified file)
costs no more memory than that. Training is deterministic: the same texts in the same order give the
same JSON, byte for byte. The trained tokenizer is cached in ``cache_dir`` under a hash of its training
texts and options, and written to ``save_path`` when one is given, so a run keeps the tokenizer its
model was trained with. A cached tokenizer that does not load (a truncated file) is trained again and
replaced, atomically; a cache folder that cannot be written is one
:class:`~composer_dynsample.data.text.cache.TokenCacheError` line, checked before training.

Determinism needs one step beyond the library: ``tokenizers``' WordPiece trainer (0.23) numbers the
``##`` continuation of each character in the iteration order of a randomly seeded hash map, and equal
pair counts are merged in id order, so two trainings on the same texts may learn different vocabularies.
:func:`train_tokenizer` lists every ``##`` character up front, in sorted order, so their ids are fixed.
The BPE trainer sorts its alphabet itself.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from composer_dynsample.data.text.cache import cache_write_error, check_cache_dir
from composer_dynsample.validation import check_bool, check_choice, check_int

__all__ = ["SPECIAL_TOKENS", "TextTokenizer", "load_tokenizer", "resolve_tokenizer", "train_tokenizer"]

#: The special tokens of a trained tokenizer, in id order: [PAD] is 0.
SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_MODELS = ("wordpiece", "bpe")
_PAD_CANDIDATES = ("[PAD]", "<pad>", "<|pad|>", "<|padding|>")
_TRAIN_VERSION = 2  # bump when the training recipe changes: the cache key carries it
_TRAIN_CHARS = 100_000  # a trained tokenizer learns from each text's first this many characters


@dataclasses.dataclass(frozen=True, eq=False)
class TextTokenizer:
    """A ``tokenizers.Tokenizer`` with padding and truncation off, and what the loaders need to know of it.

    Attributes:
        tokenizer (tokenizers.Tokenizer): The tokenizer; the loaders set truncation per call.
        pad_id (int): The id the collate pads with (padding is masked out by ``attention_mask``).
        vocab_size (int): One more than the largest token id: the size of an embedding table.
        sha256 (str): SHA-256 of its JSON serialization (padding and truncation off).
        source (str): Where it came from: a path, or ``"trained: ..."``.
        path (Path | None): The ``tokenizer.json`` it was loaded from or saved to, if any.
    """

    tokenizer: Any
    pad_id: int
    vocab_size: int
    sha256: str
    source: str
    path: Path | None = None

    @property
    def special_ids(self) -> frozenset[int]:
        """The ids of its special tokens (``[CLS]``, ``[SEP]``, ``[PAD]``, ...)."""
        decoder = self.tokenizer.get_added_tokens_decoder()
        return frozenset(int(i) for i, token in decoder.items() if token.special)

    @property
    def unknown_token(self) -> str | None:
        """The token its model gives what it cannot encode, or ``None`` (a byte-level BPE has none)."""
        token = getattr(self.tokenizer.model, "unk_token", None)
        if token is None:  # a Unigram model names its unknown token by id, in its JSON only
            unk_id = json.loads(self.tokenizer.to_str()).get("model", {}).get("unk_id")
            token = None if unk_id is None else self.tokenizer.id_to_token(int(unk_id))
        return None if token is None or self.tokenizer.token_to_id(token) is None else str(token)


def _wrap(tokenizer: Any, source: str, pad_id: int | None = None, path: Path | None = None) -> TextTokenizer:
    from tokenizers import Tokenizer

    copy = Tokenizer.from_str(tokenizer.to_str())
    padding = copy.padding
    copy.no_padding()
    copy.no_truncation()
    if pad_id is None:
        known = [copy.token_to_id(token) for token in _PAD_CANDIDATES]
        pad_id = padding["pad_id"] if padding else next((i for i in known if i is not None), 0)
    serialized = copy.to_str()
    vocab_size = max(copy.get_vocab(with_added_tokens=True).values(), default=-1) + 1
    return TextTokenizer(
        tokenizer=copy,
        pad_id=int(pad_id),
        vocab_size=max(vocab_size, copy.get_vocab_size(with_added_tokens=True)),
        sha256=hashlib.sha256(serialized.encode()).hexdigest(),
        source=source,
        path=path,
    )


def load_tokenizer(path: str | os.PathLike[str]) -> TextTokenizer:
    """Load a local ``tokenizer.json`` or a model folder; nothing is downloaded.

    Args:
        path (str | os.PathLike): A ``tokenizer.json`` file, or a folder ``transformers.AutoTokenizer``
            reads (``tokenizer.json``/``tokenizer_config.json`` and friends).

    Returns:
        TextTokenizer: The tokenizer with padding and truncation off.

    Raises:
        FileNotFoundError: If ``path`` does not exist (hub names are not looked up).
        ValueError: If the file does not parse as a tokenizer, the folder holds no fast tokenizer, or the
            vocabulary holds only special tokens (a model folder without its vocabulary file).

    Example:
        >>> import tempfile
        >>> file = Path(tempfile.mkdtemp()) / "tokenizer.json"
        >>> train_tokenizer(["a b c", "a b"], vocab_size=64).save(str(file))
        >>> loaded = load_tokenizer(file)
        >>> loaded.pad_id, loaded.tokenizer.encode("a b").tokens
        (0, ['[CLS]', 'a', 'b', '[SEP]'])
    """
    file = Path(path).expanduser()
    if not file.exists():
        raise FileNotFoundError(
            f"tokenizer {str(path)!r} is not a file or folder; give a local tokenizer.json or a model "
            "folder (nothing is downloaded), or leave it out to train one on the training split."
        )
    if file.is_dir():
        return _check_vocabulary(_load_folder(file), file)
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as error:  # tokenizers raises a bare Exception on malformed JSON
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(
            f"{file}: not a tokenizers JSON file ({first}); expected a tokenizer.json saved by "
            "tokenizers.Tokenizer.save or a transformers tokenizer's save_pretrained."
        ) from None
    return _check_vocabulary(_wrap(tokenizer, str(file), path=file), file)


def _check_vocabulary(loaded: TextTokenizer, where: Path) -> TextTokenizer:
    """``loaded``, if its vocabulary holds a token besides the special ones and the unknown token.

    Raises:
        ValueError: If it holds none: every word would encode as the unknown token.
    """
    vocab = loaded.tokenizer.get_vocab(with_added_tokens=True)
    unknown = loaded.unknown_token
    special = loaded.special_ids
    if any(i not in special and token != unknown for token, i in vocab.items()):
        return loaded
    shown = ", ".join(token for token, _ in sorted(vocab.items(), key=lambda item: item[1])[:8])
    raise ValueError(
        f"tokenizer {where} has {len(vocab)} tokens, all of them special ({shown}): every word would "
        f"encode as {unknown or 'nothing'}. A model folder needs its vocabulary (tokenizer.json, or "
        "vocab.txt for BERT); give one that has it, or leave the tokenizer out to train one on the data."
    )


def _load_folder(folder: Path) -> TextTokenizer:
    from transformers import AutoTokenizer

    try:
        loaded = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as error:  # OSError, ValueError, KeyError, ... from transformers
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(
            f"{folder}: transformers could not load a tokenizer from this folder ({first})."
        ) from None
    backend = getattr(loaded, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(
            f"{folder}: {type(loaded).__name__} is not a fast tokenizer; the loaders need one backed by "
            "tokenizers (a tokenizer.json in the folder)."
        )
    pad_id = getattr(loaded, "pad_token_id", None)
    return _wrap(backend, str(folder), pad_id=pad_id)


def _alphabet(texts: Sequence[str], normalizer: Any) -> list[str]:
    """The sorted characters of the normalised texts, whitespace left out."""
    chars: set[str] = set()
    for start in range(0, len(texts), 4096):
        chars.update(normalizer.normalize_str("\n".join(texts[start : start + 4096])))
    return sorted(char for char in chars if not char.isspace())


def train_tokenizer(
    texts: Sequence[str], *, model: str = "wordpiece", vocab_size: int = 8192, lowercase: bool = True
) -> Any:
    """Train a WordPiece or BPE tokenizer on ``texts``, deterministically (see the module docstring).

    Args:
        texts (Sequence[str]): The training texts, in a fixed order; only each one's first 100,000
            characters are learnt from.
        model (str): ``"wordpiece"`` or ``"bpe"``. Default: ``"wordpiece"``.
        vocab_size (int): The largest vocabulary, special tokens included, at least 64; a small corpus
            may give fewer. Default: ``8192``.
        lowercase (bool): Lower-case the texts before splitting them. Default: ``True``.

    Returns:
        tokenizers.Tokenizer: The tokenizer, ``[CLS] ... [SEP]`` around every encoding.

    Example:
        >>> first = train_tokenizer(["the cat sat", "the dog sat"] * 3, vocab_size=64)
        >>> first.to_str() == train_tokenizer(["the cat sat", "the dog sat"] * 3, vocab_size=64).to_str()
        True
        >>> first.encode("The cat").tokens
        ['[CLS]', 'the', 'cat', '[SEP]']
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    model = check_choice("tokenizer_model", model, _MODELS)
    vocab_size = check_int("vocab_size", vocab_size, minimum=64)  # type: ignore[assignment]
    steps = (
        [normalizers.NFKC(), normalizers.Lowercase()]
        if check_bool("lowercase", lowercase)
        else [normalizers.NFKC()]
    )
    normalizer = normalizers.Sequence(steps)
    specials = list(SPECIAL_TOKENS)
    if any(len(text) > _TRAIN_CHARS for text in texts):  # bound the memory one huge text takes
        texts = [text[:_TRAIN_CHARS] for text in texts]
    if model == "wordpiece":
        continuations = ["##" + char for char in _alphabet(texts, normalizer)]
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, special_tokens=specials + continuations, show_progress=False
        )
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    else:
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
        tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.train_from_iterator(texts, trainer, length=len(texts))
    if model == "wordpiece":  # rebuild without the "##x" helpers registered as special tokens
        rebuilt = Tokenizer(models.WordPiece(vocab=tokenizer.get_vocab(), unk_token="[UNK]"))
        rebuilt.normalizer, rebuilt.pre_tokenizer = normalizer, pre_tokenizers.BertPreTokenizer()
        rebuilt.add_special_tokens(specials)
        tokenizer = rebuilt
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    return tokenizer


def _atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def _training_key(texts: Sequence[str], model: str, vocab_size: int, lowercase: bool) -> str:
    import tokenizers

    digest = hashlib.sha256(
        json.dumps([_TRAIN_VERSION, tokenizers.__version__, model, vocab_size, lowercase]).encode()
    )
    for text in texts:
        digest.update(text.encode("utf-8", "surrogatepass") + b"\0")
    return digest.hexdigest()


def _load_cached(cached: Path, source: str) -> TextTokenizer | None:
    """The trained tokenizer cached in ``cached``, or ``None`` if there is none or it does not load."""
    if not cached.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        return _wrap(Tokenizer.from_file(str(cached)), source, path=cached)
    except Exception:  # a truncated or damaged file (tokenizers raises a bare Exception): train again
        return None


def _trained(
    train_texts: Sequence[str], cache_dir: Path, model: str, vocab_size: int, lowercase: bool
) -> TextTokenizer:
    """The tokenizer trained on ``train_texts``, read from ``cache_dir`` or trained and cached there.

    Raises:
        TokenCacheError: If it must be trained and ``cache_dir`` cannot be written (checked first).
    """
    model = check_choice("tokenizer_model", model, _MODELS)
    key = _training_key(train_texts, model, int(vocab_size), bool(lowercase))
    cached = Path(cache_dir) / f"tokenizer-{key[:24]}.json"
    source = f"trained: {model}, vocab_size={vocab_size}, lowercase={lowercase}, {len(train_texts)} texts"
    loaded = _load_cached(cached, source)
    if loaded is not None:
        return loaded
    check_cache_dir(cache_dir)
    trained = train_tokenizer(train_texts, model=model, vocab_size=vocab_size, lowercase=lowercase)
    try:
        _atomic_write_text(cached, trained.to_str())
    except OSError as error:
        raise cache_write_error(Path(cache_dir), error) from error
    return _wrap(trained, source, path=cached)


def resolve_tokenizer(
    tokenizer: str | os.PathLike[str] | None,
    train_texts: Sequence[str],
    *,
    cache_dir: Path,
    model: str = "wordpiece",
    vocab_size: int = 8192,
    lowercase: bool = True,
    save_path: str | os.PathLike[str] | None = None,
) -> TextTokenizer:
    """Load ``tokenizer``, or train one on ``train_texts`` (cached); write it to ``save_path`` if given.

    Args:
        tokenizer (str | os.PathLike, optional): A local ``tokenizer.json`` or model folder, or ``None``
            to train one.
        train_texts (Sequence[str]): The training split's texts, used only when training.
        cache_dir (Path): Where a trained tokenizer is cached, as ``tokenizer-<hash>.json``; a cached
            file that does not load is trained again and replaced.
        model (str): ``"wordpiece"`` or ``"bpe"``, when training. Default: ``"wordpiece"``.
        vocab_size (int): The vocabulary size, when training. Default: ``8192``.
        lowercase (bool): Lower-case before splitting, when training. Default: ``True``.
        save_path (str | os.PathLike, optional): Write the tokenizer's JSON here (a folder gets a
            ``tokenizer.json`` inside), written atomically. Default: ``None``.

    Returns:
        TextTokenizer: The tokenizer; ``path`` is ``save_path`` when given.

    Raises:
        FileNotFoundError: If ``tokenizer`` does not exist.
        ValueError: If ``tokenizer`` is not a usable tokenizer (:func:`load_tokenizer`), or ``save_path``
            cannot be written.
        TokenCacheError: If a tokenizer must be trained and ``cache_dir`` cannot be written (a file,
            read-only, full); checked before training.
    """
    if tokenizer is not None:
        loaded = load_tokenizer(tokenizer)
    else:
        loaded = _trained(train_texts, Path(cache_dir), model, vocab_size, lowercase)
    if save_path is None:
        return loaded
    target = Path(save_path).expanduser()
    target = target / "tokenizer.json" if target.is_dir() else target
    try:
        _atomic_write_text(target, loaded.tokenizer.to_str())
    except OSError as error:
        reason = error.strerror or str(error) or type(error).__name__
        raise ValueError(
            f"cannot write the tokenizer to {target}: {reason}; give save_tokenizer a path you can write."
        ) from error
    return dataclasses.replace(loaded, path=target)
