"""One mining step as a pure function: what :class:`~composer_dynsample.HardNegativeMining` runs at
``AFTER_FORWARD``, with no Composer inside.

:func:`mining_step` assembles the pool (the batch, other ranks' rows, the memory), runs the miner, drops
duplicate negatives, enqueues into the memory and computes the statistics, left on the device as 0-d
tensors; it returns the :class:`~composer_dynsample.MinedBatch` the loss receives. With ``deferred=True``
it reads no tensor on the host: the miner's value checks are left to :func:`step_health`, a device flag the
caller reads when it logs. :func:`all_ranks_finite` decides on the host, the same way on every rank,
whether the step can run; :func:`skipped_step` is the step that trains nothing when it cannot.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from composer_dynsample.distributed import all_reduce_sum, get_world_size
from composer_dynsample.mining.base import BaseMiner
from composer_dynsample.mining.duplicates import drop_duplicate_negatives
from composer_dynsample.mining.memory import CrossBatchMemory
from composer_dynsample.mining.mined_batch import MinedBatch
from composer_dynsample.mining.pool import assemble_pool
from composer_dynsample.mining.statistics import mining_statistics

__all__ = [
    "HEALTH_NONFINITE",
    "HEALTH_TOO_LARGE",
    "all_ranks_finite",
    "mining_step",
    "skipped_step",
    "step_health",
]

#: Bits of :func:`step_health`: some embedding is NaN or inf; some entry is too large for float32 distances.
HEALTH_NONFINITE, HEALTH_TOO_LARGE = 1, 2


def mining_step(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    miner: BaseMiner,
    *,
    strategy: str = "",
    duplicate_ids: torch.Tensor | None = None,
    cross_rank: bool = False,
    gather: str | None = None,
    memory: CrossBatchMemory | None = None,
    log_margin: float = 0.2,
    deferred: bool = False,
    max_positives: int | None = None,
) -> MinedBatch:
    """Mine one microbatch against its pool and return what the loss receives.

    Every rank must call it with the same ``cross_rank``, ``memory`` (present or not) and whether
    ``duplicate_ids`` are given: the pool's collectives (:func:`~composer_dynsample.mining.assemble_pool`)
    run on all ranks. The statistics stay on the device.

    Host reads: with ``deferred=False``, those of the miner's value checks (NaN or inf raise, float32
    overflow switches to float64, the positives' count). With ``deferred=True`` none, for ``batch_hard`` and
    ``hard_topk`` on a pool of the batch alone with ``max_positives`` given: the caller checks
    :func:`step_health` on the device instead, and the miner runs on the embeddings with NaN and inf set to
    zero, in float32 (float64 for float64 embeddings).

    Args:
        embeddings (torch.Tensor): ``(B, D)`` embeddings from the forward pass, with their graph.
        labels (torch.Tensor): ``(B,)`` integer labels.
        miner (BaseMiner): The miner, built with its options and distance.
        strategy (str): Its name, recorded in the result. Default: ``""``.
        duplicate_ids (torch.Tensor, optional): ``(B,)`` duplicate ids: rows of equal id never serve as each
            other's negatives; the count dropped is the ``duplicate_negatives_dropped`` statistic.
        cross_rank (bool): Mine against the global batch over all ranks. Default: ``False``.
        gather (str, optional): With ``cross_rank``, ``"autograd"`` (other ranks' rows carry gradient) or
            ``"constant"``.
        memory (CrossBatchMemory, optional): A cross-batch memory to mine against and then fill. Default:
            none.
        log_margin (float): The margin of the ``active_fraction`` statistic. Default: ``0.2``.
        deferred (bool): Leave the value checks to the caller's :func:`step_health` (see above). Default:
            ``False``.
        max_positives (int, optional): With ``deferred``, an upper bound of any anchor's positives in the
            pool, known on the host (the largest label count of the batch, less one). Default: unknown.

    Returns:
        MinedBatch: The embeddings, the mined tuples, the pool when it is not the batch alone, and the
        statistics as 0-d tensors on the embeddings' device (:func:`~composer_dynsample.mining.mining_statistics`).

    Example:
        >>> from composer_dynsample.mining import BatchHardMiner
        >>> emb = torch.nn.functional.normalize(torch.randn(8, 4, generator=torch.Generator().manual_seed(0)))
        >>> mined = mining_step(emb, torch.arange(8) % 4, BatchHardMiner(), strategy="batch_hard")
        >>> mined.num_tuples, mined.ref_embeddings is None, float(mined.stats["num_tuples"])
        (8, True, 8.0)
    """
    stored = memory is not None and len(memory) > 0
    if stored:
        memory.to(embeddings.device)  # a memory restored from a checkpoint sits on the CPU until used
    pool = assemble_pool(
        embeddings,
        labels,
        cross_rank=cross_rank,
        with_grad=gather == "autograd",
        memory_embeddings=memory.embeddings if stored else None,
        memory_labels=memory.labels if stored else None,
        enqueue=memory is not None,
        duplicate_ids=duplicate_ids,
        memory_duplicate_ids=memory.duplicate_ids if stored else None,
    )
    uses_pool = pool.offset is not None
    ref_labels = pool.labels if uses_pool else None
    ref_ids = pool.duplicate_ids if uses_pool else None
    ref_embeddings = pool.embeddings if uses_pool else None
    # Deferred checks: NaN or inf must not reach a miner that samples (its weights would be NaN); the step is
    # reported by step_health and what is mined from the zeros is never trained on past the next read.
    anchors = embeddings.detach().nan_to_num(0.0, 0.0, 0.0) if deferred else embeddings.detach()
    tuples = miner(
        anchors,
        labels,
        None if ref_embeddings is None else ref_embeddings.detach(),
        ref_labels,
        self_offset=pool.offset,
        values_checked=deferred,
        max_positives=max_positives if deferred else None,
    )
    dropped = None
    if duplicate_ids is not None:
        tuples, dropped = drop_duplicate_negatives(tuples, labels, duplicate_ids, ref_labels, ref_ids)
    if memory is not None:
        memory.enqueue(pool.enqueue_embeddings, pool.enqueue_labels, pool.enqueue_duplicate_ids)
    stats = mining_statistics(
        embeddings.detach(),
        pool.embeddings.detach(),
        tuples,
        distance=miner.distance,
        margin=log_margin,
        values_checked=deferred,
    )
    if dropped is not None:
        stats["duplicate_negatives_dropped"] = dropped.to(stats["num_tuples"])
    return MinedBatch(
        embeddings=embeddings,
        labels=labels,
        indices_tuple=tuples,
        ref_embeddings=ref_embeddings,
        ref_labels=ref_labels,
        strategy=strategy,
        global_mean=cross_rank and get_world_size() > 1 and uses_pool,
        stats=stats,
        duplicate_ids=duplicate_ids,
        ref_duplicate_ids=ref_ids,
        checks_deferred=deferred,
    )


def skipped_step(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    miner: BaseMiner,
    parameters: Iterable[torch.nn.Parameter],
    *,
    strategy: str = "",
) -> MinedBatch:
    """The step that trains nothing: no tuple, and zeros for embeddings attached to ``parameters``.

    Gradients through NaN activations are NaN even when multiplied by zero, so the skipped step's loss
    must not reach them: zeros attached to the parameters keep DDP in step with zero gradients. There is
    no pool, so each rank's loss is its own attached zero. The statistics are ``{"skipped": 1.0}``.

    Example:
        >>> from composer_dynsample.mining import BatchHardMiner
        >>> layer = torch.nn.Linear(2, 2)
        >>> mined = skipped_step(torch.full((4, 2), float("nan")), torch.arange(4), BatchHardMiner(), layer.parameters())
        >>> mined.embeddings.abs().sum().item(), mined.num_tuples, {k: float(v) for k, v in mined.stats.items()}
        (0.0, 0, {'skipped': 1.0})
    """
    embeddings = _zero_stand_in(embeddings, parameters)
    tuples = miner.empty(labels.device)
    stats = mining_statistics(embeddings, embeddings, tuples, skipped=True)
    return MinedBatch(
        embeddings=embeddings, labels=labels, indices_tuple=tuples, strategy=strategy, stats=stats
    )


def all_ranks_finite(embeddings: torch.Tensor) -> bool:
    """Whether the embeddings are finite on every rank: one all-reduce of a 0/1 flag, the same answer everywhere.

    The ranks must agree before any branch: a rank that skipped ``all_gather_embeddings`` (or the memory's
    enqueue gather) while another waits in it would hang both. With one rank this is a local check.

    Example:
        >>> all_ranks_finite(torch.ones(2, 2)), all_ranks_finite(torch.tensor([[float("inf")]]))
        (True, False)
    """
    nonfinite = (~torch.isfinite(embeddings.detach()).all()).to(torch.int32).reshape(1)
    return int(all_reduce_sum(nonfinite).item()) == 0


def step_health(embeddings: torch.Tensor) -> torch.Tensor:
    """What a deferred step's value checks would have found, on every rank, as a 0-d int32 device tensor.

    :data:`HEALTH_NONFINITE` when some rank's embeddings hold NaN or inf; :data:`HEALTH_TOO_LARGE` when an
    entry is so large that float32 distances overflow (``entry^2 x dim x 4`` beyond float32's range, as
    :func:`~composer_dynsample.distances.working_dtype` bounds it; float64's range for float64 embeddings);
    ``0`` when neither. One all-reduce and no host read: the caller reads it when it logs.

    Example:
        >>> int(step_health(torch.ones(2, 2))), int(step_health(torch.tensor([[float("nan")]])))
        (0, 1)
        >>> int(step_health(torch.full((1, 4), 1e19)))
        2
    """
    x = embeddings.detach()
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    bound = (torch.finfo(dtype).max / (4.0 * max(x.shape[-1], 1))) ** 0.5
    largest = x.abs().amax().to(torch.float64) if x.numel() else x.new_zeros((), dtype=torch.float64)
    finite = torch.isfinite(largest)
    flags = torch.stack([~finite, finite & (largest > bound)]).to(torch.int32)
    flags = all_reduce_sum(flags)
    return ((flags[0] > 0) * HEALTH_NONFINITE + (flags[1] > 0) * HEALTH_TOO_LARGE).to(torch.int32)


def _zero_stand_in(embeddings: torch.Tensor, parameters: Iterable[torch.nn.Parameter]) -> torch.Tensor:
    """Zeros shaped like ``embeddings`` whose graph reaches every trainable parameter with a zero gradient."""
    firsts = [p.reshape(-1)[0] for p in parameters if p.requires_grad and p.numel()]
    zeros = torch.zeros_like(embeddings.detach())
    if not firsts:
        return zeros
    anchor = torch.nan_to_num(torch.stack(firsts).sum(), nan=0.0, posinf=0.0, neginf=0.0) * 0.0
    return zeros + anchor.to(embeddings.dtype)
