"""Glyphs: a metric-learning benchmark with many classes, tested on classes never seen in training.

A class is a Unicode code point and a sample is its rendering in one of 16 TrueType faces that
matplotlib ships (``matplotlib.get_data_path()/fonts/ttf``): DejaVu Sans, DejaVu Sans Mono, DejaVu
Serif and STIX General, each regular, bold, oblique (italic) and bold-oblique. The protocol is the one
of the field's benchmarks (CUB-200, Cars196, Stanford Online Products; Musgrave et al. 2020): the
classes are split into disjoint train and test sets, and the test split is evaluated leave-one-out,
every test sample querying all the other test samples.

How the images are made (:func:`render_glyphs`):

* **Coverage:** the printable code points (Unicode categories ``L*``, ``N*``, ``P*``, ``S*``) that every
  one of the 16 faces maps in its character map: 727 with matplotlib's fonts. Requiring all 16 faces
  gives every class the same faces; "at least 12 faces" would give about 2300 classes, but mostly
  DejaVu-only ones whose samples are the three DejaVu families alone.
* **Rasterising:** FreeType through ``matplotlib.ft2font.FT2Font`` at a 64 px em, unhinted, cropped to
  the ink's bounding box, scaled by one rule for every glyph (the em becomes 24 px; a glyph whose ink
  would exceed 30 px is shrunk to fit 30 px) with Pillow's box (area) filter, and centred in a 32 x 32
  image. Values are float32 in ``[0, 1]``, ``(N, 1, 32, 32)``. A code point that renders no ink in
  some face is dropped.
* **Homoglyphs** (:func:`~composer_dynsample.data.homoglyphs.merge_homoglyphs`, importable from here
  too, at load time): code points whose 32 x 32 images are bit-equal in at least ``homoglyph_faces`` of
  the 16 faces are one glyph: the lowest code point is kept, the others are dropped, and
  :attr:`GlyphInfo.merged` lists them. The default, 12, merges Latin
  ``A`` with Greek Alpha (identical in 15 faces: STIX General regular draws them apart) and Latin ``a``
  with Cyrillic ``a`` (identical in the 12 DejaVu faces, where they share one outline): 42 code points
  of 727 with matplotlib 3.11's fonts. ``homoglyph_faces=16`` merges only the code points identical in
  every face (10), and leaves pairs such as ``A``/Alpha as two classes that no model can tell apart in
  15 of their 16 samples.

The rendered images are cached as ``glyphs_v{version}.npz`` in :func:`default_cache_dir` (written
atomically, like MNIST-1D) with the SHA-256 of every font file, the FreeType version and the SHA-256 of
the arrays. Loading a cache made from other fonts, by another FreeType, or damaged, raises
:class:`GlyphCacheError` saying which and how to regenerate it. The split into train and test classes
is made at load time from ``seed``, so one cache serves every seed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
import unicodedata
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from composer_dynsample.data.homoglyphs import merge_homoglyphs
from composer_dynsample.data.splits import DatasetSplits, atomic_savez, default_cache_dir
from composer_dynsample.data.store import TensorStore
from composer_dynsample.validation import check_bool, check_float, check_int

if TYPE_CHECKING:
    from matplotlib.ft2font import FT2Font

__all__ = [
    "FACES",
    "IMAGE_SIZE",
    "GlyphCacheError",
    "GlyphInfo",
    "GlyphSplits",
    "load_glyphs",
    "merge_homoglyphs",
    "render_glyphs",
]

#: The 16 faces, as file names in matplotlib's ``fonts/ttf`` folder; the face index of a sample.
FACES: tuple[str, ...] = (
    "DejaVuSans.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSans-Oblique.ttf",
    "DejaVuSans-BoldOblique.ttf",
    "DejaVuSansMono.ttf",
    "DejaVuSansMono-Bold.ttf",
    "DejaVuSansMono-Oblique.ttf",
    "DejaVuSansMono-BoldOblique.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSerif-Bold.ttf",
    "DejaVuSerif-Italic.ttf",
    "DejaVuSerif-BoldItalic.ttf",
    "STIXGeneral.ttf",
    "STIXGeneralBol.ttf",
    "STIXGeneralItalic.ttf",
    "STIXGeneralBolIta.ttf",
)
#: Height and width of every image.
IMAGE_SIZE = 32
_RENDER_EM_PX = 64  # FreeType renders at this em size; the result is scaled down
_EM_PX = 24  # the em's size in the final image
_MAX_INK_PX = 30  # a glyph's ink never exceeds this, so a 1 px margin stays empty
_CATEGORIES = ("L", "N", "P", "S")
_VERSION = 1  # bump when the rendering recipe changes: the cache file name carries it
_ARRAY_KEYS = ("images", "code_points")


class GlyphCacheError(ValueError):
    """The glyphs cache file does not match the installed fonts, FreeType, or its own content hash."""


@dataclasses.dataclass(frozen=True, eq=False)
class GlyphInfo:
    """What the glyph classes are, and where the images came from.

    Attributes:
        code_points (tuple[int, ...]): The code point of each label: ``chr(code_points[label])``.
        num_train_classes (int): Labels ``0 .. num_train_classes - 1`` are the train classes, the rest
            the test classes.
        faces (tuple[str, ...]): The font file of each face index (:data:`FACES`).
        train_faces (np.ndarray): ``(len(train),)`` face index of each train sample.
        test_faces (np.ndarray): ``(len(test),)`` face index of each test sample.
        merged (tuple[tuple[int, int], ...]): ``(dropped, kept)`` code points of every homoglyph merged
            into a lower code point.
        font_sha256 (tuple[str, ...]): SHA-256 of each face's font file.
        freetype_version (str): The FreeType that rendered the images.
        images_sha256 (str): SHA-256 of the cached arrays.
        generation_seconds (float | None): Time to render, or ``None`` when read from the cache.
    """

    code_points: tuple[int, ...]
    num_train_classes: int
    faces: tuple[str, ...]
    train_faces: np.ndarray
    test_faces: np.ndarray
    merged: tuple[tuple[int, int], ...]
    font_sha256: tuple[str, ...]
    freetype_version: str
    images_sha256: str
    generation_seconds: float | None

    @property
    def num_merged(self) -> int:
        """How many code points were dropped as homoglyphs of a lower code point."""
        return len(self.merged)

    def character(self, label: int) -> str:
        """The character of a label."""
        return chr(self.code_points[label])


@dataclasses.dataclass(frozen=True)
class GlyphSplits(DatasetSplits):
    """:class:`~composer_dynsample.data.DatasetSplits` with the glyph classes' :class:`GlyphInfo`.

    The train and test splits hold disjoint classes; evaluate the test split leave-one-out (each test
    sample queries all other test samples), not against the train split.

    Attributes:
        info (GlyphInfo): The classes' code points, faces, merged homoglyphs and hashes.
        test_protocol (str): ``"leave_one_out"``: how an evaluation should score the test split
            (a train gallery shares no class with it).
    """

    info: GlyphInfo
    test_protocol: str = "leave_one_out"


def _font_dir() -> Path:
    import matplotlib

    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


def _font_paths() -> list[Path]:
    paths = [_font_dir() / name for name in FACES]
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        raise FileNotFoundError(
            f"the glyphs data set needs matplotlib's bundled fonts, but these are missing: {missing}."
        )
    return paths


def _font_hashes() -> tuple[str, ...]:
    return tuple(hashlib.sha256(path.read_bytes()).hexdigest() for path in _font_paths())


def _freetype_version() -> str:
    from matplotlib import ft2font

    return str(ft2font.__freetype_version__)


def _common_code_points(fonts: list[FT2Font]) -> list[int]:
    """The printable code points (categories L, N, P, S) every font maps."""
    common = set.intersection(*(set(font.get_charmap()) for font in fonts))
    return sorted(c for c in common if unicodedata.category(chr(c))[0] in _CATEGORIES)


def _rasterise(font: FT2Font, code_point: int) -> np.ndarray:
    """The uint8 ink of one glyph at a 64 px em, cropped to its bounding box (empty when no ink)."""
    from matplotlib import ft2font

    flags = ft2font.LoadFlags.NO_HINTING if hasattr(ft2font, "LoadFlags") else ft2font.LOAD_NO_HINTING
    font.set_text(chr(code_point), 0.0, flags=flags)
    font.draw_glyphs_to_bitmap(antialiased=True)
    image = np.asarray(font.get_image())
    rows, cols = np.flatnonzero(image.any(axis=1)), np.flatnonzero(image.any(axis=0))
    if len(rows) == 0:
        return np.zeros((0, 0), dtype=np.uint8)
    return image[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]


def _fit(ink: np.ndarray) -> np.ndarray:
    """Scale the ink by the one rule (em -> 24 px, at most 30 px) and centre it in a 32 x 32 image."""
    from PIL import Image

    height, width = ink.shape
    scale = min(_EM_PX / _RENDER_EM_PX, _MAX_INK_PX / max(height, width))
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    small = np.asarray(Image.fromarray(ink).resize(size, Image.Resampling.BOX))
    out = np.zeros((IMAGE_SIZE, IMAGE_SIZE), dtype=np.uint8)
    top, left = (IMAGE_SIZE - size[1]) // 2, (IMAGE_SIZE - size[0]) // 2
    out[top : top + size[1], left : left + size[0]] = small
    return out


def _arrays_hash(arrays: Mapping[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for key in _ARRAY_KEYS:
        value = np.ascontiguousarray(arrays[key])
        digest.update(f"{key}:{value.dtype.str}:{value.shape}".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


def render_glyphs() -> dict[str, np.ndarray]:
    """Render every code point drawn by all 16 faces, dropping those with an empty rendering.

    Deterministic: the same fonts and FreeType give bit-equal arrays on every machine.

    Returns:
        dict[str, np.ndarray]: ``images`` uint8 ``(C, 16, 32, 32)``; ``code_points`` int64 ``(C,)``
        ascending (homoglyphs not merged yet); ``font_sha256``, ``freetype_version``,
        ``images_sha256`` (strings) and ``version``.

    Example:
        >>> arrays = render_glyphs()  # doctest: +SKIP
        >>> arrays["images"].shape  # doctest: +SKIP
        (..., 16, 32, 32)
    """
    from matplotlib.ft2font import FT2Font

    fonts = [FT2Font(str(path)) for path in _font_paths()]
    for font in fonts:
        font.set_size(_RENDER_EM_PX, 72)  # 72 dpi: the point size is the em in pixels
    candidates = _common_code_points(fonts)
    code_points, stacks = [], []
    for code_point in candidates:
        inks = [_rasterise(font, code_point) for font in fonts]
        if all(ink.size for ink in inks):
            code_points.append(code_point)
            stacks.append(np.stack([_fit(ink) for ink in inks]))
    arrays = {"images": np.stack(stacks), "code_points": np.asarray(code_points, dtype=np.int64)}
    arrays["font_sha256"] = np.asarray(_font_hashes())
    arrays["freetype_version"] = np.asarray(_freetype_version())
    arrays["images_sha256"] = np.asarray(_arrays_hash(arrays))
    arrays["version"] = np.asarray(_VERSION, dtype=np.int64)
    return arrays


def _regenerate_hint(path: Path) -> str:
    return f"Delete {path} or pass regenerate=True to render the glyphs again from the installed fonts."


def _read_cache(path: Path) -> dict[str, np.ndarray]:
    """Read and check a cache file; raise :class:`GlyphCacheError` saying what does not match."""
    try:
        with np.load(path, allow_pickle=False) as loaded:
            arrays = {key: loaded[key] for key in loaded.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise GlyphCacheError(
            f"{path}: not a readable glyphs cache ({error}). {_regenerate_hint(path)}"
        ) from error
    expected = (*_ARRAY_KEYS, "font_sha256", "freetype_version", "images_sha256", "version")
    missing = [key for key in expected if key not in arrays]
    if missing or int(arrays["version"]) != _VERSION:
        found = "missing " + ", ".join(missing) if missing else f"version {int(arrays['version'])}"
        raise GlyphCacheError(
            f"{path}: not a version-{_VERSION} glyphs cache ({found}). {_regenerate_hint(path)}"
        )
    stored, current = tuple(str(h) for h in arrays["font_sha256"]), _font_hashes()
    if stored != current:
        changed = [name for name, a, b in zip(FACES, stored, current) if a != b] or list(FACES)
        raise GlyphCacheError(
            f"{path} was rendered from a different font build: the SHA-256 of {changed} in "
            f"{_font_dir()} differ from the cached ones, so the images would not match these fonts. "
            + _regenerate_hint(path)
        )
    if str(arrays["freetype_version"]) != _freetype_version():
        raise GlyphCacheError(
            f"{path} was rendered by FreeType {arrays['freetype_version']}, but matplotlib here uses "
            f"FreeType {_freetype_version()}; the images would differ. {_regenerate_hint(path)}"
        )
    if _arrays_hash(arrays) != str(arrays["images_sha256"]):
        raise GlyphCacheError(
            f"{path} is corrupted: its arrays do not match their SHA-256. {_regenerate_hint(path)}"
        )
    return arrays


def _split_classes(num_classes: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted class indices, train and test, from a seeded permutation."""
    permutation = np.random.default_rng([seed, 0]).permutation(num_classes)
    num_test = int(np.floor(test_fraction * num_classes + 0.5))
    return np.sort(permutation[num_test:]), np.sort(permutation[:num_test])


def _choose_faces(num_classes: int, faces_per_class: int | None, seed: int) -> np.ndarray:
    """``(num_classes, k)`` sorted face indices: all 16 per class, or a seeded choice of ``faces_per_class``."""
    all_faces = np.arange(len(FACES))
    if faces_per_class is None:
        return np.tile(all_faces, (num_classes, 1))
    rng = np.random.default_rng([seed, 1])
    chosen = [rng.choice(all_faces, faces_per_class, replace=False) for _ in range(num_classes)]
    return np.sort(np.asarray(chosen, dtype=np.int64).reshape(num_classes, faces_per_class), axis=1)


def _samples(
    images: np.ndarray, classes: np.ndarray, first_label: int, faces: np.ndarray
) -> tuple[TensorStore, np.ndarray]:
    """A store of the ``faces`` (one row of face indices per class) of ``classes``, class-major."""
    rows = images[classes[:, None], faces]  # (len(classes), faces per class, 32, 32)
    features = torch.from_numpy(rows.reshape(-1, 1, IMAGE_SIZE, IMAGE_SIZE).astype(np.float32) / 255.0)
    labels = torch.arange(first_label, first_label + len(classes)).repeat_interleave(faces.shape[1])
    return TensorStore(features, labels), faces.reshape(-1).astype(np.int64)


def _load_or_render(path: Path, regenerate: bool) -> tuple[dict[str, np.ndarray], float | None]:
    if path.is_file() and not regenerate:
        return _read_cache(path), None
    start = time.perf_counter()
    arrays = render_glyphs()
    seconds = time.perf_counter() - start
    atomic_savez(path, **arrays)
    return arrays, seconds


def load_glyphs(
    seed: int = 0,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    test_fraction: float = 0.5,
    faces_per_class: int | None = None,
    homoglyph_faces: int = 12,
    regenerate: bool = False,
) -> GlyphSplits:
    """Load the glyphs: disjoint train and test classes, each class a code point in up to 16 faces.

    The images are rendered on the first call (about a second) and cached; see the module docstring.
    Labels are global: train classes are ``0 .. T-1`` and test classes ``T .. C-1``, each in ascending
    code point order, so a label never names two classes and the train labels are contiguous.

    Args:
        seed (int): Seed of the class split (and of the train faces with ``faces_per_class``). Default: ``0``.
        cache_dir (str | os.PathLike, optional): Cache directory. Default: :func:`default_cache_dir`.
        test_fraction (float): Fraction of the classes held out for testing, in ``(0, 1)``. Default: ``0.5``.
        faces_per_class (int, optional): Train on this many faces per class (a seeded choice per
            class, from 1 to 16) to make the task harder; the test classes keep all 16. Default:
            ``None`` (all 16).
        homoglyph_faces (int): Merge code points whose images are bit-equal in at least this many
            faces, from 1 to 16 (see :func:`merge_homoglyphs`). Default: ``12``.
        regenerate (bool): Render again and overwrite the cache file. Default: ``False``.

    Returns:
        GlyphSplits: float32 ``(N, 1, 32, 32)`` images in ``[0, 1]`` and int64 labels; ``num_classes``
        counts both splits; ``info`` is the :class:`GlyphInfo`; ``name`` is ``"glyphs"``.

    Raises:
        GlyphCacheError: If the cache file was made from other fonts or FreeType, or is damaged.
        ValueError: If an argument is out of range.

    Example:
        >>> import tempfile
        >>> splits = load_glyphs(cache_dir=tempfile.mkdtemp())  # 685 classes with matplotlib 3.11
        >>> splits.train.feature_shape, len(splits.train) == 16 * splits.info.num_train_classes
        ((1, 32, 32), True)
        >>> splits.info.character(splits.info.code_points.index(ord("A")))
        'A'
    """
    seed = check_int("seed", seed, minimum=0)  # type: ignore[assignment]
    test_fraction = check_float(
        "test_fraction", test_fraction, minimum=0, maximum=1, strict_minimum=True, strict_maximum=True
    )
    homoglyph_faces = check_int("homoglyph_faces", homoglyph_faces, minimum=1, maximum=len(FACES))
    faces_per_class = check_int(
        "faces_per_class", faces_per_class, minimum=1, maximum=len(FACES), allow_none=True
    )
    directory = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    path = directory / f"glyphs_v{_VERSION}.npz"
    arrays, seconds = _load_or_render(path, check_bool("regenerate", regenerate))
    keep, merged = merge_homoglyphs(arrays["images"], homoglyph_faces)
    images, code_points = arrays["images"][keep], arrays["code_points"][keep]
    train_classes, test_classes = _split_classes(len(code_points), test_fraction, seed)
    train_faces = _choose_faces(len(train_classes), faces_per_class, seed)
    train, train_face_index = _samples(images, train_classes, 0, train_faces)
    test_faces = _choose_faces(len(test_classes), None, seed)
    test, test_face_index = _samples(images, test_classes, len(train_classes), test_faces)
    info = GlyphInfo(
        code_points=tuple(
            int(c) for c in np.concatenate([code_points[train_classes], code_points[test_classes]])
        ),
        num_train_classes=len(train_classes),
        faces=FACES,
        train_faces=train_face_index,
        test_faces=test_face_index,
        merged=tuple((int(arrays["code_points"][d]), int(arrays["code_points"][k])) for d, k in merged),
        font_sha256=tuple(str(h) for h in arrays["font_sha256"]),
        freetype_version=str(arrays["freetype_version"]),
        images_sha256=str(arrays["images_sha256"]),
        generation_seconds=seconds,
    )
    return GlyphSplits(train=train, test=test, num_classes=len(code_points), name="glyphs", info=info)
