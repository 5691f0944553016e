"""Batched, seeded random affine augmentation of image batches on the training device.

:func:`random_affine` is the pure function (no Composer inside): one ``affine_grid``/``grid_sample``
call transforms a whole ``(N, C, H, W)`` batch wherever it lives. :func:`augmentation_generator` makes
its random draws depend on ``(seed, epoch, batch, rank)`` only. :class:`BatchAugmentation` is the thin
Composer wrapper that applies it to every training batch at ``Event.AFTER_DATALOADER``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from composer.core import Algorithm, Event, State
from composer.loggers import Logger

from composer_dynsample.batches import batch_tensor
from composer_dynsample.distributed import get_rank
from composer_dynsample.validation import InputTypeError, check_float, check_int, describe, is_int

__all__ = ["BatchAugmentation", "augmentation_generator", "random_affine"]


def augmentation_generator(seed: int, epoch: int, batch: int, rank: int = 0) -> torch.Generator:
    """A CPU generator whose state depends on ``(seed, epoch, batch, rank)`` and nothing else.

    The four numbers are mixed by :class:`numpy.random.SeedSequence`, so neighbouring batches get
    unrelated streams, and a resumed run that reaches the same batch of the same epoch draws the same
    numbers.

    Args:
        seed (int): The run's augmentation seed, ``>= 0``.
        epoch (int): The epoch, ``>= 0``.
        batch (int): The batch's index within the epoch, ``>= 0``.
        rank (int): The process's global rank, so ranks augment their different samples independently.
            Default: ``0``.

    Example:
        >>> a, b = augmentation_generator(0, 1, 2), augmentation_generator(0, 1, 2)
        >>> torch.equal(torch.rand(3, generator=a), torch.rand(3, generator=b))
        True
    """
    entropy = [check_int(name, value, minimum=0) for name, value in (("seed", seed), ("epoch", epoch))]
    entropy += [check_int("batch", batch, minimum=0), check_int("rank", rank, minimum=0)]
    state = np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


def _check_ranges(
    rotation: object, scale: object, translate: object, shear: object, noise: object
) -> tuple[float, float, float, float, float]:
    return (
        check_float("rotation", rotation, minimum=0, maximum=180),
        check_float("scale", scale, minimum=0, maximum=1, strict_maximum=True),
        check_float("translate", translate, minimum=0, maximum=1),
        check_float("shear", shear, minimum=0, maximum=60),
        check_float("noise", noise, minimum=0),
    )


def _affine_theta(
    uniforms: torch.Tensor, height: int, width: int, ranges: tuple[float, float, float, float]
) -> torch.Tensor:
    """``(N, 2, 3)`` sampling matrices for ``affine_grid`` from ``(N, 5)`` uniforms in ``[0, 1)``.

    The forward map, in pixels about the image centre, is ``p -> R(angle) Shear(shear) scale p + t``;
    ``affine_grid`` wants its inverse, in coordinates normalised to ``[-1, 1]`` on each axis.
    """
    rotation, scale, translate, shear = ranges
    signed = 2 * uniforms.double() - 1  # in [-1, 1)
    angle, shear_angle = signed[:, 0] * math.radians(rotation), signed[:, 1] * math.radians(shear)
    factor = 1 + signed[:, 2] * scale
    shift = signed[:, 3:5] * translate * torch.tensor([width, height], dtype=torch.float64)
    cos, sin, tan = torch.cos(angle), torch.sin(angle), torch.tan(shear_angle)
    # R @ [[1, tan], [0, 1]] * factor, written out: [[a, b], [c, d]].
    a, b = cos * factor, (cos * tan - sin) * factor
    c, d = sin * factor, (sin * tan + cos) * factor
    det = a * d - b * c
    inverse = torch.stack([torch.stack([d, -b], -1), torch.stack([-c, a], -1)], -2) / det[:, None, None]
    half = torch.tensor([width / 2, height / 2], dtype=torch.float64)
    linear = inverse * half[None, None, :] / half[None, :, None]  # D^-1 M^-1 D
    offset = -(inverse @ shift[:, :, None]).squeeze(-1) / half  # -D^-1 M^-1 t
    return torch.cat([linear, offset[:, :, None]], dim=2).float()


def random_affine(
    images: torch.Tensor,
    generator: torch.Generator | int,
    *,
    rotation: float = 0.0,
    scale: float = 0.0,
    translate: float = 0.0,
    shear: float = 0.0,
    noise: float = 0.0,
) -> torch.Tensor:
    """Apply an independent random affine transform (and optional noise) to every image of a batch.

    Per image: an angle uniform in ``[-rotation, rotation]`` degrees, a shear angle uniform in
    ``[-shear, shear]`` degrees (horizontal), a scale uniform in ``[1 - scale, 1 + scale]`` and a shift
    uniform in ``[-translate, translate]`` of the image's width and height. The whole batch is resampled
    by one bilinear ``grid_sample`` on its own device, with zeros outside the image; then Gaussian
    noise of standard deviation ``noise`` is added (no clamping). The transform parameters are drawn
    on the CPU from ``generator`` (identical on every device); the noise is drawn on the images' device
    from a seed taken from ``generator``. With every range zero the images are returned unchanged.

    Args:
        images (torch.Tensor): ``(N, C, H, W)`` or ``(N, H, W)`` floating-point images.
        generator (torch.Generator | int): A CPU generator (e.g. from :func:`augmentation_generator`)
            or a seed.
        rotation (float): Largest rotation in degrees, in ``[0, 180]``. Default: ``0.0``.
        scale (float): Largest relative change of size, in ``[0, 1)``. Default: ``0.0``.
        translate (float): Largest shift as a fraction of the image size, in ``[0, 1]``. Default: ``0.0``.
        shear (float): Largest shear angle in degrees, in ``[0, 60]``. Default: ``0.0``.
        noise (float): Standard deviation of additive Gaussian noise, ``>= 0``. Default: ``0.0``.

    Returns:
        torch.Tensor: The augmented images: same shape, dtype and device.

    Raises:
        TypeError: If ``images`` is not a floating-point tensor or ``generator`` neither a generator nor
            an int.
        ValueError: If ``images`` is not 3-D or 4-D, or a range is outside its interval.

    Example:
        >>> images = torch.rand(8, 1, 32, 32)
        >>> out = random_affine(images, 0, rotation=15, scale=0.1, translate=0.1, shear=10)
        >>> out.shape, torch.equal(out, random_affine(images, 0, rotation=15, scale=0.1, translate=0.1, shear=10))
        (torch.Size([8, 1, 32, 32]), True)
        >>> torch.equal(random_affine(images, 0), images)
        True
    """
    *ranges, noise = _check_ranges(rotation, scale, translate, shear, noise)
    if not isinstance(images, torch.Tensor) or not images.is_floating_point():
        raise InputTypeError(f"images must be a floating-point tensor (N, C, H, W), got {describe(images)}.")
    if images.ndim not in (3, 4):
        raise ValueError(f"images must be (N, C, H, W) or (N, H, W), got {describe(images)}.")
    if is_int(generator):
        generator = torch.Generator().manual_seed(int(generator))  # type: ignore[arg-type]
    if not isinstance(generator, torch.Generator) or generator.device.type != "cpu":
        raise InputTypeError(f"generator must be a CPU torch.Generator or an int seed, got {generator!r}.")
    if not any(ranges) and noise == 0:
        return images
    batch = images.unsqueeze(1) if images.ndim == 3 else images
    uniforms = torch.rand(len(batch), 5, generator=generator)
    noise_seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    theta = _affine_theta(uniforms, batch.shape[-2], batch.shape[-1], tuple(ranges)).to(batch.device)
    work = batch.float()
    if any(ranges):
        grid = F.affine_grid(theta, list(work.shape), align_corners=False)
        work = F.grid_sample(work, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    if noise > 0:
        device_generator = torch.Generator(device=work.device).manual_seed(noise_seed)
        work = work + noise * torch.randn(work.shape, generator=device_generator, device=work.device)
    out = work.to(images.dtype)
    return out.squeeze(1) if images.ndim == 3 else out


class BatchAugmentation(Algorithm):
    """Augment every training batch at ``AFTER_DATALOADER`` with :func:`random_affine`, on the training device.

    At ``Event.AFTER_DATALOADER`` (which Composer runs in training only, once per batch before the
    batch is split into microbatches) it moves the batch's images to the training device, transforms
    the whole batch there and puts it back into ``state.batch``. Its random draws come from
    :func:`augmentation_generator` with ``(seed, epoch, batch in epoch, rank)`` read from
    ``state.timestamp``, so a run resumed from a checkpoint sees the same augmented batches as the
    uninterrupted run. The dataset and its workers stay index-only; evaluation batches are never
    augmented.

    Args:
        rotation (float): Largest rotation in degrees. Default: ``0.0``.
        scale (float): Largest relative change of size. Default: ``0.0``.
        translate (float): Largest shift as a fraction of the image size. Default: ``0.0``.
        shear (float): Largest shear angle in degrees. Default: ``0.0``.
        noise (float): Standard deviation of additive Gaussian noise. Default: ``0.0``.
        seed (int, optional): The augmentation seed. Default: the Trainer's seed
            (``state.rank_zero_seed``).
        features_key (str | int, optional): Where the images are in ``state.batch``. Default:
            ``"features"`` for a dict batch, index ``0`` for a tuple or list batch.

    Example:
        >>> from composer import Trainer
        >>> from composer_dynsample.algorithms.augmentation import BatchAugmentation
        >>> trainer = Trainer(
        ...     model=model, train_dataloader=loader, max_duration="10ep",
        ...     algorithms=[BatchAugmentation(rotation=10, scale=0.1, translate=0.06, shear=10)],
        ... )  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        rotation: float = 0.0,
        scale: float = 0.0,
        translate: float = 0.0,
        shear: float = 0.0,
        noise: float = 0.0,
        seed: int | None = None,
        features_key: str | int | None = None,
    ) -> None:
        checked = _check_ranges(rotation, scale, translate, shear, noise)  # now, not mid-run
        self.ranges = dict(zip(("rotation", "scale", "translate", "shear", "noise"), checked))
        self.seed = check_int("seed", seed, minimum=0, allow_none=True)
        self.features_key = features_key

    def match(self, event: Event, state: State) -> bool:
        return event == Event.AFTER_DATALOADER

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        """Replace the batch's images by their augmented copies, on the training device."""
        images, key = batch_tensor(state, self.features_key, "features", 0)
        if images is None:
            raise ValueError(
                f"BatchAugmentation looked for the images at state.batch[{key!r}] and found "
                f"{type(images).__name__}; set features_key to where they are."
            )
        if state.device is not None:
            images = state.device.tensor_to_device(images)
        seed = self.seed if self.seed is not None else state.rank_zero_seed
        generator = augmentation_generator(
            seed, int(state.timestamp.epoch), int(state.timestamp.batch_in_epoch), get_rank()
        )
        state.batch_set_item(key, random_affine(images, generator, **self.ranges))
