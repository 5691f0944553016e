"""Every distance of the package, one set of names, one validator.

Three forms of the same three distances:

* the no-grad *ranking* form the miners use (:class:`RankMatrix`, :func:`pairwise_distance`);
* the differentiable ``(N, M)`` matrix the losses use (:func:`distance_matrix`);
* the differentiable *row-paired* form, ``d(x[i], y[i])``, for losses and statistics
  (:func:`paired_distance`).

Three distances are supported, named as in :data:`DISTANCES`:

* ``"cosine"``: ``1 - cos(x, y)``, in ``[0, 2]``. Embeddings are L2-normalised first.
* ``"euclidean"``: ``||x - y||_2`` on the embeddings as given (no normalisation).
* ``"squared_euclidean"``: ``||x - y||_2 ** 2``.

Most miners need only the order of the distances and their differences (margins), so internally they
may work on a *rank matrix* that equals the distance minus a constant (see :class:`RankMatrix`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Final

import torch
import torch.nn.functional as F

from composer_dynsample.validation import check_choice, check_embeddings

__all__ = [
    "DISTANCES",
    "RankMatrix",
    "check_distance",
    "distance_matrix",
    "paired_distance",
    "pairwise_distance",
    "working_dtype",
]

DISTANCES: Final[tuple[str, ...]] = ("cosine", "euclidean", "squared_euclidean")

_NORM_EPS: Final[float] = 1e-12  # F.normalize's default


def check_distance(distance: object) -> str:
    """Return ``distance`` if it names a supported distance, else raise a ``ValueError``.

    Args:
        distance: The value to check.

    Returns:
        The distance name.

    Raises:
        ValueError: If ``distance`` is not one of :data:`DISTANCES`.

    Example:
        >>> check_distance("euclidean")
        'euclidean'
    """
    return check_choice("distance", distance, DISTANCES)


def working_dtype(x: torch.Tensor, y: torch.Tensor, *, values_checked: bool = False) -> torch.dtype:
    """The dtype miners and retrieval metrics compute distances in: never half precision, never overflowing.

    fp16 and bf16 inputs are computed in float32: ``||x||^2 + ||y||^2 - 2 x.y`` cancels catastrophically
    in half precision (two unit vectors one degree apart, true distance 0.0175, come out 0.0 in fp16).
    float32 inputs whose squared norms could overflow (entries near 1e18 and above) are computed in
    float64, so a finite input never gives an inf or NaN distance and a wrong tuple; inputs too large
    even for float64 raise a ``ValueError``. That decision reads the largest entry on the host; with
    ``values_checked=True`` the caller vouches for it (a training step checks it on the device,
    :func:`~composer_dynsample.mining.step.step_health`) and the promoted dtype is returned with no read.

    Example:
        >>> working_dtype(torch.ones(2, 3, dtype=torch.float16), torch.ones(4, 3, dtype=torch.float16))
        torch.float32
        >>> working_dtype(torch.full((2, 3), 1e20), torch.ones(4, 3))
        torch.float64
    """
    dtype = torch.promote_types(torch.promote_types(x.dtype, y.dtype), torch.float32)
    if values_checked or (x.numel() == 0 and y.numel() == 0):
        return dtype
    largest = max(float(t.detach().abs().max()) if t.numel() else 0.0 for t in ((x,) if y is x else (x, y)))
    needed = largest * largest * max(x.shape[-1], 1) * 4.0  # a bound on |x.y| + ||x||^2 + ||y||^2
    if dtype == torch.float32 and needed > torch.finfo(torch.float32).max:
        dtype = torch.float64
    if needed > torch.finfo(torch.float64).max:
        raise ValueError(
            f"embeddings with entries up to {largest:.3g} overflow every distance computation; normalise or "
            "rescale them."
        )
    return dtype


class RankMatrix:
    """Rows of a pairwise distance matrix, shifted by a constant, computed one chunk of rows at a time.

    ``rows(start, stop)[i, j] == distance(x[start + i], y[j]) - offset``. Inputs are prepared once
    (normalised, squared norms) so a chunk costs one matrix multiplication plus O(1) elementwise passes.

    For ``"cosine"`` with ``nonnegative=False`` the matrix is ``-x_n @ y_n.T`` (``offset == 1``): the
    negated cosine similarity is computed exactly as similarity-based code (e.g.
    pytorch-metric-learning's ``CosineSimilarity``) computes the similarity, so thresholds such as
    ``s - eps < max_s`` give bit-identical decisions, which ``1 - s`` (rounded) would not.
    With ``nonnegative=True`` the true distance is returned (``offset == 0``), clamped at zero.

    The rows are in :func:`working_dtype`: float32 for fp16/bf16 inputs, float64 where float32 would
    overflow.

    Args:
        x: Query embeddings, ``(B, D)``.
        y: Reference embeddings, ``(M, D)``, same dtype and device as ``x``.
        distance: One of :data:`DISTANCES`.
        nonnegative: Return the true (non-negative) distance instead of a shifted one.
        dtype: The dtype to compute in, for a caller that has chosen it already. Default:
            ``working_dtype(x, y)``.
    """

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        distance: str,
        *,
        nonnegative: bool = False,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.distance = check_distance(distance)
        self.nonnegative = nonnegative
        self.offset = 1.0 if distance == "cosine" and not nonnegative else 0.0
        dtype = working_dtype(x, y) if dtype is None else dtype
        same = y is x
        x = x.to(dtype)
        self._prepare(x, x if same else y.to(dtype))

    def _prepare(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.distance == "cosine":
            # As F.normalize computes it (x / max(||x||, eps)), with the sign folded into the division:
            # negation is exact, so (-x_n) @ y_n.T == -(x_n @ y_n.T) bit for bit, with no extra pass.
            x_norm = x.norm(p=2, dim=1, keepdim=True).clamp_min(_NORM_EPS)
            yn = x / x_norm if y is x else F.normalize(y, p=2, dim=1, eps=_NORM_EPS)
            self._a, self._b = x / x_norm.neg(), yn.T
            self._row_term = self._col_term = None
        else:
            # ||x - y||^2 = ||x||^2 + ||y||^2 - 2 x.y; scaling by -2 is exact.
            self._a, self._b = -2.0 * x, y.T
            self._row_term = (x * x).sum(dim=1, keepdim=True)
            self._col_term = self._row_term.T if y is x else (y * y).sum(dim=1).unsqueeze(0)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the rows returned: see :func:`working_dtype`."""
        return self._a.dtype

    @property
    def shape(self) -> tuple[int, int]:
        """``(B, M)``: the number of rows and columns of the whole matrix."""
        return self._a.shape[0], self._b.shape[1]

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """Return rows ``start:stop`` of the (shifted) distance matrix as a new tensor."""
        a = self._a[start:stop]
        if self.distance == "cosine":
            if not self.nonnegative:
                return a @ self._b
            return (a @ self._b).add_(1.0).clamp_(min=0.0)
        out = torch.addmm(self._col_term, a, self._b)
        out.add_(self._row_term[start:stop]).clamp_(min=0.0)
        if self.distance == "euclidean":
            out.sqrt_()
        return out


def pairwise_distance(x: torch.Tensor, y: torch.Tensor, distance: str = "cosine") -> torch.Tensor:
    """Return the ``(N, M)`` matrix of distances between the rows of ``x`` and the rows of ``y``.

    Euclidean distances use ``||x||^2 + ||y||^2 - 2 x.y`` (one matrix multiplication, like
    ``torch.cdist`` for large inputs), clamped at zero, so very small distances carry an absolute
    error of about ``sqrt(eps) * ||x||``. This is a mining helper: it runs under ``torch.no_grad()``
    and returns a matrix without gradient history.

    Args:
        x: ``(N, D)`` floating-point tensor.
        y: ``(M, D)`` floating-point tensor on the same device.
        distance: ``"cosine"`` (``1 - cosine similarity``, the default), ``"euclidean"`` or
            ``"squared_euclidean"``.

    Returns:
        ``(N, M)`` tensor in :func:`working_dtype` of ``x`` and ``y`` (float32 for half-precision inputs,
        float64 where float32 would overflow).

    Raises:
        ValueError: If an input is not a 2-D floating-point tensor, the feature dimensions differ, the
            devices differ or ``distance`` is unknown.

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
        >>> pairwise_distance(x, x, "cosine")
        tensor([[0., 1.],
                [1., 0.]])
        >>> pairwise_distance(x, x, "euclidean")
        tensor([[0.0000, 2.2361],
                [2.2361, 0.0000]])
    """
    check_distance(distance)
    check_embeddings("x", x, finite=False)
    check_embeddings("y", y, finite=False)
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"x and y must have the same feature dimension, got {x.shape[1]} and {y.shape[1]}.")
    if x.device != y.device:
        raise ValueError(f"x and y must be on the same device, got {x.device} and {y.device}.")
    with torch.no_grad():
        return RankMatrix(x, y, distance, nonnegative=True).rows(0, x.shape[0])


_AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps", "hpu")


def paired_distance(
    x: torch.Tensor, y: torch.Tensor, distance: str = "cosine", *, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Distance between ``x[i]`` and ``y[i]`` for every row ``i``, with the miners' definitions.

    ``"cosine"`` is ``1 - cos(x, y)``, ``"euclidean"`` is ``||x - y||`` (its square root is taken of a
    value clamped at ``1e-12`` so identical rows get a finite gradient), ``"squared_euclidean"`` its square.
    Computed (differentiably) in :func:`working_dtype`, as the miners compute distances: float32 for
    fp16 and bf16 rows, float64 for float32 rows whose squares would overflow.

    Args:
        x: ``(N, D)`` rows.
        y: ``(N, D)`` rows.
        distance: One of :data:`DISTANCES`. Default: ``"cosine"``.
        dtype: The dtype to compute in, for a caller that has already asked :func:`working_dtype` (one
            host sync) for several calls. Default: ``working_dtype(x, y)``.

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [0.0, 3.0]])
        >>> y = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
        >>> paired_distance(x, y, "cosine").tolist(), paired_distance(x, y, "squared_euclidean").tolist()
        ([1.0, 0.0], [2.0, 4.0])
    """
    check_distance(distance)
    dtype = working_dtype(x, y) if dtype is None else dtype
    x, y = x.to(dtype), y.to(dtype)
    if distance == "cosine":
        return 1.0 - torch.nn.functional.cosine_similarity(x, y, dim=-1, eps=1e-12)
    squared = (x - y).pow(2).sum(-1)
    return squared.clamp_min(1e-12).sqrt() if distance == "euclidean" else squared


def distance_matrix(
    x: torch.Tensor, y: torch.Tensor, distance: str = "cosine", *, values_checked: bool = False
) -> torch.Tensor:
    """Differentiable ``(N, M)`` distances between the rows of ``x`` and ``y``: one matrix multiplication.

    Losses index this matrix at their tuples: with tens of thousands of pairs, gathering embedding rows
    per tuple (and scattering their gradients back) costs far more than one ``N x M`` product. The
    matrix is computed (and returned) in :func:`working_dtype`, as the miners' distances are: fp16 and
    bf16 inputs in float32, also under autocast (Composer runs the loss under it with ``amp_fp16`` /
    ``amp_bf16``), and float32 inputs whose squared norms would overflow (entries near 1e18 and above)
    in float64, so that the losses stay finite where the miners still find tuples; the gradient flows
    back to the inputs in their own dtype. Inputs too large even for float64 raise a ``ValueError``.
    ``values_checked=True``: the caller has checked the entries' size on the device, so no value is read on
    the host (see :func:`working_dtype`).

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [0.0, 3.0]])
        >>> distance_matrix(x, x, "squared_euclidean").tolist()
        [[0.0, 10.0], [10.0, 0.0]]
        >>> distance_matrix(x * 1e20, x * 1e20, "euclidean").dtype
        torch.float64
    """
    check_distance(distance)
    same = y is x
    dtype = working_dtype(x, y, values_checked=values_checked)
    x = x.to(dtype)
    y = x if same else y.to(dtype)
    # Composer runs the loss under autocast with amp_fp16 / amp_bf16, which would cast the products back
    # to half precision: tight classes' distances round to zero and unnormalised fp16 ones overflow.
    with _without_autocast(x.device):
        if distance == "cosine":
            x_unit = torch.nn.functional.normalize(x, dim=-1, eps=1e-12)
            y_unit = x_unit if y is x else torch.nn.functional.normalize(y, dim=-1, eps=1e-12)
            return 1.0 - x_unit @ y_unit.T
        squared = (x.pow(2).sum(-1)[:, None] + y.pow(2).sum(-1)[None, :] - 2.0 * (x @ y.T)).clamp_min(0.0)
        return squared.clamp_min(1e-12).sqrt() if distance == "euclidean" else squared


def _without_autocast(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Autocast switched off on ``device`` (a no-op where autocast does not apply)."""
    if device.type in _AUTOCAST_DEVICES:
        return torch.autocast(device_type=device.type, enabled=False)
    return contextlib.nullcontext()
