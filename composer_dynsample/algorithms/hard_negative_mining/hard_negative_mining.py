"""Mine hard tuples at ``Event.AFTER_FORWARD`` on the embeddings the forward pass just produced.

:func:`mine` is the pure function (no Composer inside); :class:`HardNegativeMining` is the thin Composer
wrapper that moves data between ``State`` and it.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from composer.core import Algorithm, Event, State, Time
from composer.loggers import Logger

from composer_dynsample import mining
from composer_dynsample.algorithms._batch import batch_rows, batch_tensor, find_in_batch
from composer_dynsample.algorithms.hard_negative_mining.checks import (
    NothingMinedWatch,
    check_duplicate_ids,
    check_embeddings_and_labels,
    check_strategy,
    parse_schedule,
)
from composer_dynsample.algorithms.hard_negative_mining.memory import CrossBatchMemory
from composer_dynsample.distances import paired_distance
from composer_dynsample.distributed import all_reduce_sum, get_world_size, unwrap_model
from composer_dynsample.mined import MinedBatch
from composer_dynsample.mining.duplicates import drop_duplicate_negatives
from composer_dynsample.mining.pool import Pool, assemble_pool
from composer_dynsample.mining.statistics import mining_statistics
from composer_dynsample.validation import check_bool, check_choice, check_float, check_int, parse_time

__all__ = ["STRATEGIES", "HardNegativeMining", "mine"]

log = logging.getLogger(__name__)

STRATEGIES: dict[str, Callable[..., tuple[torch.Tensor, ...]]] = {
    "batch_hard": mining.batch_hard,
    "semi_hard": mining.semi_hard,
    "hard_topk": mining.hard_topk,
    "distance_weighted": mining.distance_weighted,
    "multi_similarity": mining.multi_similarity,
    "random_triplets": mining.random_triplets,
}
_GATHERS = ("autograd", "constant")
_ON_NONFINITE = ("raise", "skip")


def mine(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    strategy: str = "semi_hard",
    *,
    ref_embeddings: torch.Tensor | None = None,
    ref_labels: torch.Tensor | None = None,
    self_offset: int | None = None,
    distance: str = "cosine",
    **miner_kwargs: Any,
) -> tuple[torch.Tensor, ...]:
    """Run one mining strategy under ``no_grad`` and return PML-style index tuples.

    Args:
        embeddings (torch.Tensor): ``(B, D)`` anchors.
        labels (torch.Tensor): ``(B,)`` integer labels.
        strategy (str): One of :data:`STRATEGIES`. Default: ``"semi_hard"``.
        ref_embeddings (torch.Tensor, optional): ``(M, D)`` reference pool; positives and negatives
            index it. Default: the batch itself.
        ref_labels (torch.Tensor, optional): The pool's labels.
        self_offset (int, optional): When the pool contains the anchors themselves (a cross-rank pool or
            the batch followed by a memory), anchor ``i`` sits at pool row ``self_offset + i``, and the
            miner never pairs an anchor with its own row. Default: ``None``.
        distance (str): ``"cosine"``, ``"euclidean"`` or ``"squared_euclidean"``. Default: ``"cosine"``.
        **miner_kwargs: Passed to the strategy (``margin`` for ``semi_hard``, ``k`` for ``hard_topk``, ...).

    Returns:
        Triplets ``(anchors, positives, negatives)`` or pairs ``(a1, p, a2, n)``.

    Example:
        >>> emb = torch.nn.functional.normalize(torch.randn(8, 4, generator=torch.Generator().manual_seed(0)))
        >>> anchors, positives, negatives = mine(emb, torch.arange(8) % 4, "batch_hard")
        >>> anchors.tolist()
        [0, 1, 2, 3, 4, 5, 6, 7]
    """
    check_strategy(strategy, STRATEGIES)
    if ref_embeddings is None:
        self_offset = None  # the batch is the pool: the miners skip each anchor's own row already
    with torch.no_grad():
        return STRATEGIES[strategy](
            embeddings,
            labels,
            ref_embeddings,
            ref_labels,
            distance=distance,
            self_offset=self_offset,
            **miner_kwargs,
        )


def _check_miner_kwargs(strategy: str, kwargs: dict[str, Any], distance: str) -> None:
    """Check a strategy's ``miner_kwargs`` now, by name and by a call on four rows, not when it first runs.

    A strategy scheduled from a later epoch would otherwise fail only there, after hours of training.
    """
    miner = STRATEGIES[strategy]
    taken = [
        name
        for name, parameter in inspect.signature(miner).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and name not in ("distance", "self_offset")
    ]
    unknown = sorted(set(kwargs) - set(taken))
    if unknown:
        raise ValueError(f"miner_kwargs[{strategy!r}] has unknown keys {unknown}; {strategy} takes {taken}.")
    try:
        with torch.random.fork_rng(devices=[]):  # random strategies draw: leave the caller's RNG as it was
            miner(torch.eye(4, 2), torch.tensor([0, 0, 1, 1]), distance=distance, **kwargs)
    except (TypeError, ValueError) as error:
        raise ValueError(f"miner_kwargs[{strategy!r}]: {error}") from None


class HardNegativeMining(Algorithm):
    """Mine hard tuples at ``AFTER_FORWARD`` from the forward pass's embeddings and hand them to the loss.

    At every microbatch it reads the embeddings from ``state.outputs`` and the labels from ``state.batch``,
    mines under ``no_grad`` (no extra forward pass, current weights, whole batch at once) and replaces
    ``state.outputs`` with a :class:`~composer_dynsample.MinedBatch` that the model's ``loss`` consumes
    (see :mod:`composer_dynsample.mined` for the contract).

    ``AFTER_FORWARD`` fires once per microbatch, so the pool is the microbatch, plus the other ranks'
    microbatches with ``cross_rank=True``, plus the cross-batch memory when it is on. When Composer splits
    the device batch (``device_train_microbatch_size`` below it) this warns once: leave microbatching
    off and bound memory with ``EmbeddingModel(forward_chunk_size=N)`` instead, which gives mining the
    whole batch.

    Args:
        strategy (str | Mapping[str, str]): A strategy name (``batch_hard``, ``semi_hard``, ``hard_topk``,
            ``distance_weighted``, ``multi_similarity``, or the baseline ``random_triplets``), or a schedule mapping Composer time strings to
            the strategy that starts then, e.g. ``{"0ep": "semi_hard", "40ep": "batch_hard"}`` (it must
            start at zero). Default: ``"semi_hard"``.
        distance (str): ``"cosine"``, ``"euclidean"`` or ``"squared_euclidean"``. Default: ``"cosine"``.
        miner_kwargs (Mapping[str, Mapping[str, Any]], optional): Keyword arguments per strategy, e.g.
            ``{"semi_hard": {"margin": 0.2}}``. Default: none.
        embeddings_key (str | int, optional): Where the embeddings are in ``state.outputs``: ``None`` when
            the outputs are the embeddings tensor, else a dict key or a tuple index. Default: ``None``.
        labels_key (str | int, optional): Where the labels are in ``state.batch``. Default: ``"labels"``
            for a dict batch, index ``1`` for a tuple or list batch.
        duplicate_key (str | int, optional): Where a duplicate id per row is in ``state.batch`` (e.g.
            ``"text_hash"`` of text batches): rows of equal id are the same sample under different labels
            and never serve as each other's negatives. Mined tuples whose negative repeats the anchor or
            one of its positives are dropped (logged as ``mining/duplicate_negatives_dropped``), the ids
            travel with the labels through the cross-rank pool and the memory, and the
            :class:`~composer_dynsample.MinedBatch` carries them to the loss
            (:class:`~composer_dynsample.InfoNCELoss` masks such rows out of its negatives).
            Default: ``None`` (off).
        cross_rank (bool): Mine against the global batch over all ranks. Default: ``False``.
        gather (str, optional): With ``cross_rank``, how the other ranks' embeddings join the pool, to be
            chosen explicitly: ``"autograd"`` (gradients flow to every rank; with the losses of
            :mod:`composer_dynsample.losses` the gradient equals one process's on the concatenated batch)
            or ``"constant"`` (only local embeddings carry gradient; cheaper). Default: ``None``.
        memory_size (int): Rows of cross-batch memory (XBM); ``0`` turns it off. Default: ``0``.
        memory_start (str): Composer time string from which the memory is filled and mined against
            (XBM starts once embeddings have settled). Default: ``"0ba"``.
        on_nonfinite (str): NaN or inf embeddings ``"raise"`` a ``ValueError`` or ``"skip"`` the step: the
            loss is then zero, attached to the parameters with zero gradients (so DDP stays in step and
            no NaN reaches the weights). Default: ``"raise"``.
        log_margin (float): The margin of the logged fraction of active triplets
            (``d(a, p) - d(a, n) + margin > 0``). Default: ``0.2``.
        collapse_threshold (float): Warn when the mean pairwise distance of a microbatch falls below
            this: the embeddings have collapsed to a point. Once per fall: after it recovers to ten times
            the threshold, a new fall warns again. Default: ``1e-3``.

    Example:
        >>> from composer import Trainer
        >>> from composer_dynsample import EmbeddingModel, HardNegativeMining, TripletMarginLoss
        >>> trainer = Trainer(
        ...     model=EmbeddingModel(encoder, loss=TripletMarginLoss(margin=0.2)),
        ...     train_dataloader=loader, max_duration="60ep",
        ...     algorithms=[HardNegativeMining({"0ep": "semi_hard", "40ep": "batch_hard"})],
        ... )  # doctest: +SKIP
    """

    def __init__(
        self,
        strategy: str | Mapping[str, str] = "semi_hard",
        *,
        distance: str = "cosine",
        miner_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        embeddings_key: str | int | None = None,
        labels_key: str | int | None = None,
        duplicate_key: str | int | None = None,
        cross_rank: bool = False,
        gather: str | None = None,
        memory_size: int = 0,
        memory_start: str = "0ba",
        on_nonfinite: str = "raise",
        log_margin: float = 0.2,
        collapse_threshold: float = 1e-3,
    ) -> None:
        self.schedule = parse_schedule(strategy, STRATEGIES)
        paired_distance(torch.zeros(1, 1), torch.zeros(1, 1), distance)  # validates the name now, not mid-run
        self.distance = distance
        self.miner_kwargs = {name: dict(kwargs) for name, kwargs in (miner_kwargs or {}).items()}
        for name in self.miner_kwargs:
            check_strategy(name, STRATEGIES, "a miner_kwargs key")
        for name, kwargs in self.miner_kwargs.items():
            _check_miner_kwargs(name, kwargs, distance)
        self.embeddings_key, self.labels_key = embeddings_key, labels_key
        if duplicate_key is not None and (
            isinstance(duplicate_key, bool) or not isinstance(duplicate_key, (str, int))
        ):
            raise ValueError(
                f"duplicate_key must be a batch key (a string or an index) or None, got {duplicate_key!r}."
            )
        self.duplicate_key = duplicate_key
        cross_rank = check_bool("cross_rank", cross_rank)
        if cross_rank and gather not in _GATHERS:
            raise ValueError(
                f"cross_rank=True needs an explicit gather: 'autograd' (gradients flow to every rank) or "
                f"'constant' (other ranks' embeddings as constants), got {gather!r}."
            )
        if not cross_rank and gather is not None:
            raise ValueError(f"gather={gather!r} only applies with cross_rank=True.")
        self.cross_rank, self.gather = cross_rank, gather
        self.on_nonfinite = check_choice("on_nonfinite", on_nonfinite, _ON_NONFINITE)
        memory_size = check_int("memory_size", memory_size, minimum=0)
        self.memory = CrossBatchMemory(memory_size) if memory_size else None
        self.memory_start = parse_time("memory_start", memory_start)
        self.log_margin = check_float("log_margin", log_margin, finite=True)
        self.collapse_threshold = check_float("collapse_threshold", collapse_threshold, minimum=0.0)
        self._warned_collapse = False
        self._nothing_mined = NothingMinedWatch()
        self._warned_microbatch = False
        self._device_rows: int | None = None

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.AFTER_DATALOADER, Event.AFTER_FORWARD)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        """Mine the microbatch, log its statistics and hand a :class:`MinedBatch` to the loss.

        Host syncs per step: one all-ranks finiteness flag (every rank must take the same branch before
        any collective) and one ``tolist`` of the stacked statistics, besides what the miner needs.
        ``AFTER_DATALOADER`` only notes the device batch's size, before Composer splits it.
        """
        if event == Event.AFTER_DATALOADER:  # labels that are not there yet are looked for at AFTER_FORWARD
            self._device_rows = batch_rows(batch_tensor(state, self.labels_key, "labels", 1)[0])
            return
        embeddings = _find(
            state.outputs, self.embeddings_key, "the embeddings", "embeddings_key", where="state.outputs"
        )
        labels = self._labels(state)
        check_embeddings_and_labels(embeddings, labels)
        ids = self._duplicate_ids(state, labels)
        self._check_microbatch(labels.shape[0], state)
        strategy = self.strategy_at(state)
        embeddings, pool, tuples, stats = self._mine_or_skip(embeddings, labels, ids, strategy, state)
        values = dict(zip(stats, torch.stack(list(stats.values())).tolist()))  # the statistics' one host sync
        logger.log_metrics({f"mining/{name}": value for name, value in values.items()})
        self._check_collapse(values, state)
        if "num_tuples" in values:  # a skipped step mined nothing on purpose
            self._nothing_mined.update(
                values["num_tuples"],
                labels,
                pool.labels if pool.offset is not None else None,
                strategy=strategy,
                batch=int(state.timestamp.batch) + 1,  # the batch being trained, counted from 1
                steps_per_epoch=None if state.dataloader_len is None else int(state.dataloader_len),
            )
        uses_pool = pool.offset is not None
        state.outputs = MinedBatch(
            embeddings=embeddings,
            labels=labels,
            indices_tuple=tuples,
            ref_embeddings=pool.embeddings if uses_pool else None,
            ref_labels=pool.labels if uses_pool else None,
            strategy=strategy,
            # A skipped step has no pool: each rank's loss is its own attached zero.
            global_mean=self.cross_rank and get_world_size() > 1 and uses_pool,
            outputs=state.outputs,
            stats=values,
            duplicate_ids=ids,
            ref_duplicate_ids=pool.duplicate_ids if uses_pool else None,
        )

    def _mine_or_skip(
        self,
        embeddings: torch.Tensor,
        labels: torch.Tensor,
        ids: torch.Tensor | None,
        strategy: str,
        state: State,
    ) -> tuple[torch.Tensor, Pool, tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
        """Mine when every rank's embeddings are finite; else raise or skip the step on every rank alike."""
        if _all_ranks_finite(embeddings):
            pool, tuples, dropped = self._mine(embeddings, labels, ids, strategy, state)
            stats = mining_statistics(
                embeddings.detach(),
                pool.embeddings.detach(),
                tuples,
                distance=self.distance,
                margin=self.log_margin,
            )
            if dropped is not None:  # joins the one stacked host sync of the statistics
                stats["duplicate_negatives_dropped"] = dropped.to(stats["num_tuples"])
            return embeddings, pool, tuples, stats
        if self.on_nonfinite == "raise":
            raise ValueError(
                f"HardNegativeMining: the embeddings at batch {int(state.timestamp.batch)} contain NaN or inf "
                "(on this or another rank). Lower the learning rate, check the inputs, or pass "
                "on_nonfinite='skip' to skip such steps."
            )
        # Gradients through NaN activations are NaN even when multiplied by zero, so the skipped step's
        # loss must not reach them: zeros attached to the parameters keep DDP in step with zero grads.
        embeddings = _zero_stand_in(embeddings, state.model)
        tuples = _empty_like(strategy, labels.device)
        stats = mining_statistics(embeddings, embeddings, tuples, skipped=True)
        return embeddings, Pool(embeddings, labels, None, None, None), tuples, stats

    def _labels(self, state: State) -> torch.Tensor:
        return _find(state, self.labels_key, "the labels", "labels_key", dict_key="labels", index=1)

    def _duplicate_ids(self, state: State, labels: torch.Tensor) -> torch.Tensor | None:
        """The batch's duplicate ids at ``duplicate_key``, checked, or ``None`` when the option is off."""
        if self.duplicate_key is None:
            return None
        ids = _find(state, self.duplicate_key, "the duplicate ids", "duplicate_key")
        return check_duplicate_ids(ids, labels, self.duplicate_key)

    def _mine(
        self,
        embeddings: torch.Tensor,
        labels: torch.Tensor,
        ids: torch.Tensor | None,
        strategy: str,
        state: State,
    ) -> tuple[Pool, tuple[torch.Tensor, ...], torch.Tensor | None]:
        """Assemble the pool (all ranks take part in its collectives), mine, drop duplicate negatives when
        ``ids`` are given (their count is returned), then enqueue into the memory."""
        memory = self.memory if self.memory is not None and _reached(state, self.memory_start) else None
        stored = memory is not None and len(memory) > 0
        if stored:
            memory.to(embeddings.device)  # a memory restored from a checkpoint sits on the CPU until used
        pool = assemble_pool(
            embeddings,
            labels,
            cross_rank=self.cross_rank,
            with_grad=self.gather == "autograd",
            memory_embeddings=memory.embeddings if stored else None,
            memory_labels=memory.labels if stored else None,
            enqueue=memory is not None,
            duplicate_ids=ids,
            memory_duplicate_ids=memory.duplicate_ids if stored else None,
        )
        uses_pool = pool.offset is not None
        tuples = mine(
            embeddings.detach(),
            labels,
            strategy,
            ref_embeddings=pool.embeddings.detach() if uses_pool else None,
            ref_labels=pool.labels if uses_pool else None,
            self_offset=pool.offset,
            distance=self.distance,
            **self.miner_kwargs.get(strategy, {}),
        )
        dropped = None
        if ids is not None:
            tuples, dropped = drop_duplicate_negatives(
                tuples,
                labels,
                ids,
                pool.labels if uses_pool else None,
                pool.duplicate_ids if uses_pool else None,
            )
        if memory is not None:
            memory.enqueue(pool.enqueue_embeddings, pool.enqueue_labels, pool.enqueue_duplicate_ids)
        return pool, tuples, dropped

    def strategy_at(self, state: State) -> str:
        """The strategy the schedule gives for the current time."""
        current = self.schedule[0][1]
        for start, name in self.schedule:
            if _reached(state, start):
                current = name
        return current

    def _check_collapse(self, stats: dict[str, float], state: State) -> None:
        """Warn when the spread falls below ``collapse_threshold``: once per fall, so that a network whose
        first outputs are nearly identical (common without normalisation layers) and that spreads out
        still gets a warning if it collapses later. Recovery means ten times the threshold."""
        spread = stats.get("embedding_spread")
        if spread is None:
            return
        if spread >= 10 * self.collapse_threshold:
            self._warned_collapse = False
            return
        if self._warned_collapse or spread >= self.collapse_threshold:
            return
        self._warned_collapse = True
        memory = (
            " A cross-batch memory that starts while the embeddings still move fast can do this too: start "
            "it later (memory_start)."
            if self.memory is not None and _reached(state, self.memory_start)
            else ""
        )
        warnings.warn(
            f"HardNegativeMining: the embeddings have collapsed (mean pairwise {self.distance} distance "
            f"{spread:.2e} < {self.collapse_threshold:g} at batch {int(state.timestamp.batch)}). Batch-hard "
            "mining from the first step often does this; start with semi_hard and switch later, e.g. "
            "strategy={'0ep': 'semi_hard', '40ep': 'batch_hard'}, or lower the learning rate." + memory,
            UserWarning,
            stacklevel=2,
        )

    def _check_microbatch(self, rows: int, state: State) -> None:
        """Warn once when Composer split the device batch, so that mining sees a microbatch, not the batch."""
        if self._warned_microbatch or self._device_rows is None or rows >= self._device_rows:
            return
        self._warned_microbatch = True
        chunk = getattr(unwrap_model(state.model), "forward_chunk_size", None)
        advice = (
            f"forward_chunk_size={chunk} already bounds the activation memory: set "
            f"device_train_microbatch_size to the device batch ({self._device_rows})"
            if chunk
            else "EmbeddingModel(forward_chunk_size=N) with device_train_microbatch_size at the device batch "
            "gives mining the whole batch at one chunk's activation memory"
        )
        warnings.warn(
            f"HardNegativeMining: Composer split the device batch of {self._device_rows} rows into "
            f"microbatches of {rows} (device_train_microbatch_size), so mining, the cross-batch memory and "
            f"the loss see one microbatch at a time. {advice}.",
            UserWarning,
            stacklevel=2,
        )

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["memory"] = None if self.memory is None else self.memory.state_dict()
        state["warned_collapse"] = self._warned_collapse
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("memory")
        if saved is not None:
            if self.memory is None:
                raise ValueError(
                    f"the checkpoint holds a cross-batch memory of {saved['size']} rows but this "
                    "HardNegativeMining has memory_size=0; pass the same memory_size to resume."
                )
            self.memory.load_state_dict(saved)
        self._warned_collapse = bool(state.get("warned_collapse", False))


def _find(
    source: Any, key: str | int | None, what: str, option: str, where: str = "state.batch", **defaults: Any
) -> torch.Tensor:
    """The tensor at ``key`` of the batch or outputs, else an error that names ``option``."""
    advice = f"Set {option} to where it is."
    return find_in_batch(
        source, key, **defaults, owner="HardNegativeMining", what=what, advice=advice, where=where
    )


def _reached(state: State, time: Time) -> bool:
    return int(state.timestamp.get(time.unit)) >= int(time.value)


def _all_ranks_finite(embeddings: torch.Tensor) -> bool:
    """Whether the embeddings are finite on every rank: one all-reduce of a 0/1 flag, the same answer everywhere.

    The ranks must agree before any branch: a rank that skipped ``all_gather_embeddings`` (or the memory's
    enqueue gather) while another waits in it would hang both. With one rank this is a local check.
    """
    nonfinite = (~torch.isfinite(embeddings.detach()).all()).to(torch.int32).reshape(1)
    return int(all_reduce_sum(nonfinite).item()) == 0


def _empty_like(strategy: str, device: torch.device) -> tuple[torch.Tensor, ...]:
    empty = torch.empty(0, dtype=torch.int64, device=device)
    return (empty,) * (4 if strategy == "multi_similarity" else 3)


def _zero_stand_in(embeddings: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
    """Zeros shaped like ``embeddings`` whose graph reaches every trainable parameter with a zero gradient."""
    firsts = [p.reshape(-1)[0] for p in model.parameters() if p.requires_grad and p.numel()]
    zeros = torch.zeros_like(embeddings.detach())
    if not firsts:
        return zeros
    anchor = torch.nan_to_num(torch.stack(firsts).sum(), nan=0.0, posinf=0.0, neginf=0.0) * 0.0
    return zeros + anchor.to(embeddings.dtype)
