"""Image folders: ``root/<class_name>/<image>``, or ``root/train/<class_name>/...`` and ``root/test/<class_name>/...``.

The class folders that hold images (png, jpg, jpeg, bmp, gif) are numbered in sorted order of their
names (hidden ones such as ``.ipynb_checkpoints/``, hidden files and folders without images are
skipped); the images are read with Pillow and scaled to [0, 1] (8-bit images by 1/255, 16-bit
grayscale PNGs by 1/65535). :func:`~composer_dynsample.data.load_file` reads a directory with
:func:`load_image_folder`.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from composer_dynsample.data.splits import DatasetSplits, stratified_split
from composer_dynsample.data.store import TensorStore
from composer_dynsample.validation import check_bool, is_int

__all__ = ["load_image_folder", "read_images"]

_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")


# Pillow modes of one-channel integer images wider than 8 bits: a 16-bit grayscale PNG opens as
# "I;16" (older Pillow: "I"); they hold values in [0, 65535], which convert("L") would clip at 255.
_WIDE_GRAY_MODES = ("I", "I;16", "I;16L", "I;16B", "I;16N")


def _is_visible(path: Path) -> bool:
    return not path.name.startswith(".")  # .ipynb_checkpoints/, .DS_Store, macOS ._x.png


def _image_files(class_dir: Path) -> list[Path]:
    """The images of a class folder, sorted by name: visible files with an image suffix."""
    return sorted(
        file
        for file in class_dir.iterdir()
        if _is_visible(file) and file.suffix.lower() in _IMAGE_SUFFIXES and file.is_file()
    )


def _check_size(size: object) -> tuple[int, int] | None:
    if size is None:
        return None
    valid = isinstance(size, (tuple, list)) and len(size) == 2 and all(is_int(n) and n >= 1 for n in size)
    if not valid:
        hint = f"; for a square image pass ({size}, {size})" if is_int(size) and size >= 1 else ""
        raise ValueError(f"size must be None or a pair of integers >= 1 (H, W), got {size!r}{hint}.")
    return int(size[0]), int(size[1])  # type: ignore[index]


def _image_to_array(file: Path, image: Any, size: tuple[int, int] | None, grayscale: bool) -> np.ndarray:
    """An opened Pillow image as a float32 ``(H, W)`` (grayscale) or ``(H, W, 3)`` array in [0, 1]."""
    from PIL import Image

    if image.mode == "F":
        raise ValueError(f"{file}: floating-point images (Pillow mode 'F') are not supported.")
    if image.mode not in _WIDE_GRAY_MODES:  # 8 bits per channel: L, RGB, RGBA, P, LA, 1, CMYK, ...
        image = image.convert("L" if grayscale else "RGB")
        if size is not None:
            image = image.resize((size[1], size[0]))
        return np.asarray(image, dtype=np.float32) / 255.0
    values = np.asarray(image)
    low, high = int(values.min()), int(values.max())
    if low < 0 or high > 65535:
        raise ValueError(
            f"{file}: integer image (Pillow mode {image.mode!r}) holds values in [{low}, {high}]; "
            "expected 8- or 16-bit values in [0, 65535]."
        )
    array = values.astype(np.float32) / 65535.0  # 16 bits: scale by the bit depth, not by 255
    if size is not None:
        array = np.asarray(Image.fromarray(array).resize((size[1], size[0])), dtype=np.float32)
        array = array.clip(0.0, 1.0)  # the default bicubic filter may overshoot
    return array if grayscale else np.repeat(array[:, :, None], 3, axis=2)


def _read_image(file: Path, size: tuple[int, int] | None, grayscale: bool) -> np.ndarray:
    """One image file as in :func:`_image_to_array`, or a one-line ``ValueError`` naming the file."""
    from PIL import Image

    bombs = (Image.DecompressionBombError, Image.DecompressionBombWarning)
    try:
        with warnings.catch_warnings():
            # Beyond MAX_IMAGE_PIXELS Pillow only warns, then decodes; beyond twice that it raises.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(file) as image:
                return _image_to_array(file, image, size, grayscale)
    except bombs as error:
        found = re.search(r"\((\d+) pixels\)", str(error))  # Pillow says "Image size (N pixels) exceeds ..."
        pixels = f"{found.group(1)} pixels" if found else str(error)
        raise ValueError(
            f"{file}: refused as a possible decompression bomb: {pixels}, more than Pillow's limit of "
            f"{Image.MAX_IMAGE_PIXELS} (PIL.Image.MAX_IMAGE_PIXELS); resize the image, or raise that "
            "limit if you trust the file."
        ) from None
    except OSError as error:
        raise ValueError(f"{file}: not a readable image ({error}).") from error


def read_images(
    folder: str | os.PathLike[str], *, size: tuple[int, int], grayscale: bool
) -> tuple[torch.Tensor, list[Path]]:
    """The images of one folder (not its sub-folders), sorted by name, as :func:`load_image_folder` reads them.

    Returns:
        tuple[torch.Tensor, list[Path]]: float32 ``(N, C, H, W)`` in [0, 1] (``C`` is 1 when ``grayscale``,
        else 3) resized to ``size``, and the files.

    Raises:
        ValueError: If the folder holds no image, or a file is not a readable image.
    """
    directory = Path(folder).expanduser()
    files = _image_files(directory)
    if not files:
        raise ValueError(f"{directory}: found no images with suffix {_IMAGE_SUFFIXES}.")
    arrays = [_read_image(file, size, grayscale) for file in files]
    images = [array[None] if array.ndim == 2 else array.transpose(2, 0, 1) for array in arrays]
    return _stack(images, 1 if grayscale else 3), files


def _read_image_classes(
    root: Path, class_names: list[str], size: tuple[int, int] | None, grayscale: bool | None
) -> tuple[list[np.ndarray], list[int]]:
    """The ``(C, H, W)`` images and labels under ``root``; ``grayscale=None`` keeps one channel per gray image."""
    images, labels = [], []
    for label, class_name in enumerate(class_names):
        class_dir = root / class_name
        if not class_dir.is_dir():
            continue
        for file in _image_files(class_dir):
            array = _read_image(file, size, bool(grayscale))
            if grayscale is None and array.ndim == 3 and _is_gray(array):
                array = np.ascontiguousarray(array[:, :, 0])  # as reading it as "L" would give
            array = array[None] if array.ndim == 2 else array.transpose(2, 0, 1)
            if images and array.shape[1:] != images[0].shape[1:]:
                raise ValueError(
                    f"{file}: image of shape {array.shape[1:]} differs from earlier images "
                    f"{images[0].shape[1:]}; pass size=(H, W)."
                )
            images.append(array)
            labels.append(label)
    return images, labels


def _is_gray(rgb: np.ndarray) -> bool:
    """Whether an ``(H, W, 3)`` image has no colour: its three channels are equal everywhere."""
    return bool((rgb[:, :, 0] == rgb[:, :, 1]).all() and (rgb[:, :, 1] == rgb[:, :, 2]).all())


def _stack(images: list[np.ndarray], channels: int) -> torch.Tensor:
    """``(N, channels, H, W)`` from ``(C, H, W)`` images; a one-channel image fills every channel."""
    stacked = np.empty((len(images), channels, *images[0].shape[1:]), dtype=np.float32)
    for row, image in enumerate(images):
        stacked[row] = image  # broadcasts (1, H, W) to (3, H, W) when other images have colour
    return torch.from_numpy(stacked)


def _read_stores(
    bases: tuple[Path, ...], class_names: list[str], size: tuple[int, int] | None, grayscale: bool | None
) -> list[TensorStore]:
    """One store per base folder, all with the same number of channels: three if any image has colour."""
    read = [_read_image_classes(base, class_names, size, grayscale) for base in bases]
    for base, (images, _) in zip(bases, read):
        if not images:
            raise ValueError(f"{base}: found no images with suffix {_IMAGE_SUFFIXES} in its class folders.")
    channels = max(image.shape[0] for images, _ in read for image in images)
    return [
        TensorStore(_stack(images, channels), torch.tensor(labels, dtype=torch.int64))
        for images, labels in read
    ]


def _class_folders(directory: Path, split_dirs: tuple[Path, Path], presplit: bool) -> list[str]:
    """The sorted names of the visible class folders that hold images (under train/ and test/ if presplit)."""
    class_names = sorted(
        {
            child.name
            for base in (split_dirs if presplit else (directory,))
            for child in base.iterdir()
            if _is_visible(child) and child.is_dir() and _image_files(child)
        }
    )
    if not class_names:
        half_split = [d.name + "/" for d in split_dirs if d.is_dir()]
        hint = (
            f"; it has {half_split[0]} but a pre-split folder needs both train/ and test/"
            if half_split
            else ""
        )
        raise ValueError(
            f"{directory}: expected one sub-directory per class (root/<class_name>/<image>) holding "
            f"images with suffix {_IMAGE_SUFFIXES}, found none{hint}."
        )
    return class_names


def load_image_folder(
    root: str | os.PathLike[str],
    *,
    size: tuple[int, int] | list[int] | None = None,
    grayscale: bool | None = None,
    test_fraction: float | None = None,
    seed: int = 0,
    name: str | None = None,
) -> DatasetSplits:
    """Load ``root/<class_name>/<image>`` (or ``root/{train,test}/<class_name>/<image>``) with Pillow.

    A class is a sub-folder that holds at least one image (a file ending in .png, .jpg, .jpeg, .bmp
    or .gif); hidden folders and files (names starting with ``.``, e.g. ``.ipynb_checkpoints/``) and
    folders without images are skipped, and the remaining class folders are numbered in sorted order
    of their names, which the result keeps as ``class_names``. 8-bit images are scaled by ``1/255``,
    16-bit grayscale PNGs by ``1/65535``.

    Colour: by default the images keep their colour, three channels (``"RGB"``), when any of them
    has colour (an image whose red, green and blue are equal everywhere has none, whatever its
    Pillow mode), and are read as one channel (``"L"``) when none has; ``grayscale=True`` or
    ``False`` forces one or three channels. A transparent image is read without its alpha channel.

    Args:
        root (str | os.PathLike): The directory.
        size (tuple[int, int] | list[int], optional): Resize every image to ``(H, W)``, two integers
            ``>= 1``; without it all images must have the same size. Default: ``None``.
        grayscale (bool, optional): ``True`` reads one channel (``"L"``), ``False`` three (``"RGB"``).
            Default: ``None``: three channels if any image has colour, else one.
        test_fraction (float, optional): As in :func:`load_file`. Default: ``None``.
        seed (int): Seed of the split. Default: ``0``.
        name (str, optional): The name in the result. Default: the directory's name.

    Returns:
        DatasetSplits: float32 features ``(N, C, H, W)`` in [0, 1]; labels number the classes in sorted
        order of their folder names, ``class_names[label]`` is the folder name.

    Raises:
        FileNotFoundError: If ``root`` is not a directory.
        ValueError: If ``size`` is not ``None`` or ``(H, W)``, ``grayscale`` not ``None`` or a bool,
            if there are no class folders with images, if an image is unreadable or declares more pixels than Pillow's
            decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS``), or if sizes differ without ``size``.

    Example:
        >>> import tempfile
        >>> from PIL import Image
        >>> root = Path(tempfile.mkdtemp())
        >>> for name in ("cat", "dog"):
        ...     (root / name).mkdir()
        ...     for i in range(5):
        ...         Image.new("L", (8, 6), color=40 * i).save(root / name / f"{i}.png")
        >>> splits = load_image_folder(root)
        >>> splits.train.features.shape, len(splits.test), splits.class_names
        (torch.Size([8, 1, 6, 8]), 2, ('cat', 'dog'))
    """
    size = _check_size(size)
    if grayscale is not None:
        grayscale = check_bool("grayscale", grayscale)
    directory = Path(root).expanduser()
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no such directory.")
    split_dirs = (directory / "train", directory / "test")
    presplit = all(d.is_dir() for d in split_dirs)
    class_names = _class_folders(directory, split_dirs, presplit)
    if presplit:
        if test_fraction is not None:
            raise ValueError(
                f"{directory}: holds train/ and test/ already; "
                f"test_fraction must be None, got {test_fraction!r}."
            )
        train, test = _read_stores(split_dirs, class_names, size, grayscale)
        if train.feature_shape != test.feature_shape:
            raise ValueError(
                f"{directory}: train images {train.feature_shape} and test images {test.feature_shape} "
                "differ; pass size=(H, W)."
            )
    else:
        (whole,) = _read_stores((directory,), class_names, size, grayscale)
        train_idx, test_idx = stratified_split(
            whole.labels, 0.2 if test_fraction is None else test_fraction, seed
        )
        train = TensorStore(whole.features[train_idx], whole.labels[train_idx])
        test = TensorStore(whole.features[test_idx], whole.labels[test_idx])
    return DatasetSplits(
        train=train,
        test=test,
        num_classes=len(class_names),
        name=name or directory.name,
        class_names=tuple(class_names),
    )
