"""Mine hard tuples at ``Event.AFTER_FORWARD`` on the embeddings the forward pass just produced.

:class:`HardNegativeMining` only matches events and moves data between ``State`` and the pure functions
of :mod:`composer_dynsample.mining`: the miners, built once with their options, and
:func:`~composer_dynsample.mining.mining_step`, which returns the
:class:`~composer_dynsample.MinedBatch` the loss receives. Its checks are in
:mod:`.checks`, its warnings while training in :mod:`.monitors`, its schedule in :mod:`.schedule`.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from composer.core import Algorithm, Event, State
from composer.loggers import Logger

from composer_dynsample.algorithms.hard_negative_mining.checks import (
    build_scheduled_miners,
    check_batch_key,
    check_batches,
    check_pool_options,
    largest_label_count,
    microbatch_warning,
    nonfinite_message,
    read_step_tensors,
)
from composer_dynsample.algorithms.hard_negative_mining.log_window import LogWindow
from composer_dynsample.algorithms.hard_negative_mining.monitors import CollapseWatch, NothingMinedWatch
from composer_dynsample.algorithms.hard_negative_mining.schedule import StrategySchedule, reached
from composer_dynsample.batches import batch_rows, batch_tensor
from composer_dynsample.distances import check_distance
from composer_dynsample.distributed import unwrap_model
from composer_dynsample.losses.mined_loss import CALL
from composer_dynsample.mining.memory import CrossBatchMemory
from composer_dynsample.mining.mined_batch import MinedBatch
from composer_dynsample.mining.step import all_ranks_finite, mining_step, skipped_step, step_health
from composer_dynsample.samplers.wiring import check_microbatches, check_train_loader
from composer_dynsample.validation import check_choice, check_float, check_int, parse_time

__all__ = ["HardNegativeMining"]

_ON_NONFINITE = ("raise", "skip")
# Where the batch is noted, mined, and its statistics read (BATCH_END of a logging step, each epoch's and the
# run's end).
_EVENTS = (
    Event.FIT_START, Event.AFTER_DATALOADER, Event.AFTER_FORWARD, Event.BATCH_END, Event.EPOCH_END, Event.FIT_END,
)  # fmt: skip


class HardNegativeMining(Algorithm):
    """Mine hard tuples at ``AFTER_FORWARD`` from the forward pass's embeddings and hand them to the loss.

    At every microbatch it reads the embeddings from ``state.outputs`` and the labels from ``state.batch``,
    mines under ``no_grad`` (no extra forward pass, current weights, whole batch at once) and replaces
    ``state.outputs`` with a :class:`~composer_dynsample.MinedBatch` that the model's ``loss`` consumes
    (see :mod:`composer_dynsample.mining.mined_batch` for the contract).

    The pool is the microbatch (``AFTER_FORWARD`` fires once per microbatch), plus the other ranks' with
    ``cross_rank=True``, plus the cross-batch memory when it is on. When Composer splits the device batch
    it warns once: bound memory with ``EmbeddingModel(forward_chunk_size=N)`` instead.

    **No host read in a step.** A step reads no tensor's value on the host (on a GPU such a read waits for
    the whole queue, and the host can no longer run ahead): the statistics, the finiteness of the embeddings
    and the warnings' counters stay on the device (:mod:`.log_window`) and are read back in one transfer
    every ``log_interval`` batches, at the end of each epoch and at the end of training, at ``BATCH_END``,
    where Composer has just read the loss. The statistics logged are then the means over those steps. The
    miners ``batch_hard`` and ``hard_topk`` on a pool of the batch alone read nothing; the others, the
    cross-rank pool and the memory may read what they need (a count, a size). ``on_nonfinite="skip"`` must
    decide before the loss, so it reads one flag a step.

    **Wiring.** At ``FIT_START`` it refuses, in one line naming the fix, a batch sampler given to the
    ``DataLoader`` as ``sampler=`` and microbatches that cut every P x K batch into single classes
    (:mod:`composer_dynsample.samplers.wiring`). A loss that never reads the mined tuples
    (``MinedBatch.indices_tuple``) trains on every tuple of the batch: the algorithm warns once, naming
    :func:`~composer_dynsample.mined_loss`, the one call to write in one's own model's ``loss``.

    Args:
        strategy (str | Mapping[str, str]): A name of :data:`~composer_dynsample.mining.MINERS`, or a
            schedule of Composer time strings to the strategy that starts then, from zero, e.g.
            ``{"0ep": "semi_hard", "40ep": "batch_hard"}``. Default: ``"semi_hard"``.
        distance (str): ``"cosine"``, ``"euclidean"`` or ``"squared_euclidean"``. Default: ``"cosine"``.
        miner_kwargs (Mapping[str, Mapping[str, Any]], optional): Options per strategy, checked now, e.g.
            ``{"semi_hard": {"margin": 0.2}}`` builds ``SemiHardMiner(margin=0.2)``. Default: none.
        embeddings_key (str | int, optional): Where the embeddings are in ``state.outputs``: ``None`` when
            the outputs are the embeddings tensor, else a dict key or a tuple index. Default: ``None``.
        labels_key (str | int, optional): Where the labels are in ``state.batch``. Default: ``"labels"``
            for a dict batch, index ``1`` for a tuple or list batch.
        duplicate_key (str | int, optional): Where a duplicate id per row is in ``state.batch`` (e.g.
            ``"text_hash"``): rows of equal id never serve as each other's negatives, in the mined tuples
            and (through the :class:`~composer_dynsample.MinedBatch`) in the loss; see the method card.
            Default: ``None`` (off).
        cross_rank (bool): Mine against the global batch over all ranks. Default: ``False``.
        gather (str, optional): With ``cross_rank``, to be chosen explicitly: ``"autograd"`` (gradients
            flow to every rank, as one process's on the concatenated batch) or ``"constant"`` (cheaper).
        memory_size (int): Rows of cross-batch memory (XBM); ``0`` turns it off. Default: ``0``.
        memory_start (str): Composer time string from which the memory is filled and mined against
            (XBM starts once embeddings have settled). Default: ``"0ba"``.
        on_nonfinite (str): NaN or inf embeddings ``"raise"`` a ``ValueError`` or ``"skip"`` the step (a
            zero loss with zero gradients, so DDP stays in step). ``"raise"`` is checked on the device and
            raised at the next read (see above), naming the first such batch; entries too large for
            float32 distances (about 1e17 and above) raise too, where ``"skip"`` mines them in float64.
            Default: ``"raise"``.
        log_margin (float): The margin of the logged fraction of active triplets
            (``d(a, p) - d(a, n) + margin > 0``). Default: ``0.2``.
        collapse_threshold (float): Warn (once per fall) when the mean pairwise distance of a microbatch
            falls below this: the embeddings have collapsed to a point. Default: ``1e-3``.
        log_interval (int | str): Batches between two reads of the statistics (an int or a time string in
            batches, ``"50ba"``): the steps between read nothing on the host. Default: ``"1ba"`` (every step).

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
        log_interval: int | str = "1ba",
    ) -> None:
        self.schedule = StrategySchedule(strategy)
        self.distance = check_distance(distance)
        self.miners = build_scheduled_miners(self.schedule.names, miner_kwargs, self.distance)
        self.embeddings_key, self.labels_key = embeddings_key, labels_key
        self.duplicate_key = check_batch_key("duplicate_key", duplicate_key)
        self.cross_rank, self.gather = check_pool_options(cross_rank, gather)
        self.on_nonfinite = check_choice("on_nonfinite", on_nonfinite, _ON_NONFINITE)
        memory_size = check_int("memory_size", memory_size, minimum=0)
        self.memory = CrossBatchMemory(memory_size) if memory_size else None
        self.memory_start = parse_time("memory_start", memory_start)
        self.log_margin = check_float("log_margin", log_margin, finite=True)
        threshold = check_float("collapse_threshold", collapse_threshold, minimum=0.0)
        self._collapse = CollapseWatch(threshold, self.distance)
        self._nothing_mined = NothingMinedWatch()
        self.log_interval = check_batches("log_interval", log_interval)
        self._window = LogWindow()
        self._memory_used = False
        self._warned_microbatch = False
        self._warned_unread = False
        self._handed_over: list[MinedBatch] = []  # this step's mined microbatches, checked at BATCH_END
        self._device_rows: int | None = None
        self._max_positives: int | None = None

    def match(self, event: Event, state: State) -> bool:
        return event in _EVENTS

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        """Note the device batch (``AFTER_DATALOADER``), mine the microbatch and hand a :class:`MinedBatch` to
        the loss (``AFTER_FORWARD``), or read, log and check the steps since the last read (``BATCH_END`` of
        a logging step, ``EPOCH_END``, ``FIT_END``)."""
        if event == Event.FIT_START:  # the loader's wiring, before the first batch
            check_train_loader(state.train_dataloader)
            check_microbatches(state.train_dataloader, state.device_train_microbatch_size)
            return
        if event == Event.BATCH_END:
            self._check_tuples_read()
        if event == Event.AFTER_DATALOADER:  # labels that are not there yet are looked for at AFTER_FORWARD
            labels = batch_tensor(state, self.labels_key, "labels", 1)[0]
            self._device_rows = batch_rows(labels)
            self._max_positives = largest_label_count(labels)
            return
        if event in (Event.EPOCH_END, Event.FIT_END) or (
            event == Event.BATCH_END and int(state.timestamp.batch) % self.log_interval == 0
        ):
            self._read(state, logger)
        elif event != Event.BATCH_END:  # AFTER_FORWARD
            state.outputs = self._mine(state)

    def _mine(self, state: State) -> MinedBatch:
        """Mine the microbatch; with ``on_nonfinite="skip"`` the ranks first agree whether to (one read)."""
        embeddings, labels, ids = read_step_tensors(
            state, self.embeddings_key, self.labels_key, self.duplicate_key
        )
        self._warn_microbatch(labels.shape[0], state)
        strategy = self.strategy_at(state)
        miner, batch = self.miners[strategy], int(state.timestamp.batch)
        on = self.memory is not None and reached(state.timestamp, self.memory_start)
        memory = self.memory if on else None
        self._memory_used = memory is not None
        pool = {"duplicate_ids": ids, "cross_rank": self.cross_rank, "gather": self.gather, "memory": memory}
        health = None
        if self.on_nonfinite == "raise":
            health = step_health(embeddings)
            alone = memory is None and not self.cross_rank  # the label counts of the batch bound the pool's
            bound = None if self._max_positives is None or not alone else self._max_positives - 1
            mined = mining_step(
                embeddings, labels, miner, strategy=strategy, log_margin=self.log_margin, deferred=True,
                max_positives=bound, **pool,
            )  # fmt: skip
        elif all_ranks_finite(embeddings):
            mined = mining_step(
                embeddings, labels, miner, strategy=strategy, log_margin=self.log_margin, **pool
            )
        else:
            mined = skipped_step(embeddings, labels, miner, state.model.parameters(), strategy=strategy)
        mined.outputs = state.outputs
        self._window.add(mined, batch=batch, health=health)
        mined.tuples_read = False  # from here on, only what the loss reads
        self._handed_over.append(mined)
        return mined

    def _check_tuples_read(self) -> None:
        """Warn once when the step's loss read none of the mined tuples: it trained on every tuple of the batch."""
        handed, self._handed_over = self._handed_over, []
        if self._warned_unread or not handed or any(mined.tuples_read for mined in handed):
            return
        self._warned_unread = True
        warnings.warn(
            f"HardNegativeMining: the loss never read the tuples {handed[-1].strategy} mined (MinedBatch."
            "indices_tuple), so it trained on every tuple of the batch and the mining was thrown away. In the "
            f"model's loss, call {CALL}.",
            UserWarning,
            stacklevel=3,
        )

    def _read(self, state: State, logger: Logger) -> None:
        """Read the steps since the last read (one transfer): raise on unhealthy embeddings, log, warn."""
        reading = self._window.read()
        if reading is None:
            return
        if reading.first_unhealthy_batch is not None:
            raise ValueError(nonfinite_message(reading.first_unhealthy_batch, reading.health))
        logger.log_metrics({f"mining/{name}": value for name, value in reading.means.items()})
        window = self._window
        self._collapse.update(
            {} if reading.last_spread is None else {"embedding_spread": reading.last_spread},
            batch=window.last_batch,
            memory_active=self._memory_used,
            smallest=reading.smallest_spread,
        )
        if window.last_labels is not None:
            labels, pool_labels = window.last_labels
            self._nothing_mined.update(
                reading.longest_empty_run,
                labels,
                pool_labels,
                strategy=window.last_strategy,
                batch=window.last_batch + 1,  # the batch being trained, counted from 1
                steps_per_epoch=None if state.dataloader_len is None else int(state.dataloader_len),
                device_rows=self._device_rows,
            )

    def strategy_at(self, state: State) -> str:
        """The strategy the schedule gives for the current time."""
        return self.schedule.at(state.timestamp)

    def _warn_microbatch(self, rows: int, state: State) -> None:
        """Warn once when Composer split the device batch, so that mining sees a microbatch, not the batch."""
        if self._warned_microbatch:
            return
        chunk = getattr(unwrap_model(state.model), "forward_chunk_size", None)
        message = microbatch_warning(rows, self._device_rows, chunk)
        if message is not None:
            self._warned_microbatch = True
            warnings.warn(message, UserWarning, stacklevel=3)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["memory"] = None if self.memory is None else self.memory.state_dict()
        state["warned_collapse"] = self._collapse.warned
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
        self._collapse.warned = bool(state.get("warned_collapse", False))
