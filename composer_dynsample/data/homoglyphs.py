"""Homoglyphs: code points whose renderings are bit-equal in enough faces are one class of the glyphs data.

:func:`merge_homoglyphs` groups them (closed under the relation: Latin B, Greek Beta and Cyrillic Ve form
one group) and keeps the lowest code point of each group;
:func:`~composer_dynsample.data.glyphs.load_glyphs` applies it at load time with its ``homoglyph_faces``,
and records the merged code points in :attr:`~composer_dynsample.data.glyphs.GlyphInfo.merged`.
"""

from __future__ import annotations

import numpy as np

__all__ = ["merge_homoglyphs"]


def merge_homoglyphs(images: np.ndarray, min_faces: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Group the classes whose images are bit-equal in at least ``min_faces`` faces; keep the first of each.

    Two classes are homoglyphs when their ``(16, 32, 32)`` renderings are identical in ``min_faces`` or
    more faces; groups are closed under this relation (Latin B, Greek Beta and Cyrillic Ve form one
    group). Each group keeps its lowest index.

    Args:
        images (np.ndarray): ``(C, F, H, W)`` renderings, classes in ascending code point order.
        min_faces (int): Faces that must be bit-equal, from 1 to ``F``.

    Returns:
        tuple[np.ndarray, list[tuple[int, int]]]: The sorted indices kept, and ``(dropped, kept)`` index
        pairs.

    Example:
        >>> images = np.zeros((3, 2, 1, 1), dtype=np.uint8)
        >>> images[2, 1] = 1  # class 2 differs from 0 and 1 in face 1 only
        >>> merge_homoglyphs(images, 2)[1], merge_homoglyphs(images, 1)[1]
        ([(1, 0)], [(1, 0), (2, 0)])
    """
    equal_faces: dict[tuple[int, int], int] = {}
    for face in range(images.shape[1]):
        groups: dict[bytes, list[int]] = {}
        for index in range(len(images)):
            groups.setdefault(images[index, face].tobytes(), []).append(index)
        for members in groups.values():
            for i, first in enumerate(members):
                for second in members[i + 1 :]:
                    equal_faces[first, second] = equal_faces.get((first, second), 0) + 1
    root = list(range(len(images)))

    def find(index: int) -> int:
        while root[index] != index:
            index = root[index]
        return index

    for (first, second), count in sorted(equal_faces.items()):
        if count >= min_faces:
            low, high = sorted((find(first), find(second)))
            root[high] = low  # the lower index stays the root, so each group keeps its lowest code point
    keep = np.asarray([index for index in range(len(images)) if find(index) == index], dtype=np.int64)
    merged = [(index, find(index)) for index in range(len(images)) if find(index) != index]
    return keep, merged
