"""An embedding table of the whole training set, fed by the forward pass: model-awareness beyond the batch.

One row per training sample holds the embedding the forward pass last produced for it, and the batch
at which it was written. :class:`EmbeddingTable` writes the rows at ``Event.AFTER_FORWARD`` from the
embeddings the step already computed (the batch carries each sample's ``index``), gathered from every
rank, so the table is identical everywhere and costs no extra forward pass. Class centroids, nearest
classes and nearest samples are then functions of the table (:func:`class_centroids`), for samplers that
build batches from what the current model confuses. An optional refresh re-embeds rows that grew old,
in one batched no-grad pass in eval mode at chosen epoch starts, and an optional warm start encodes the
whole training set with the starting model before the first step, so a model-aware sampler mines from
the first epoch on; both log what they cost.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from composer.core import Algorithm, Event, State
from composer.loggers import Logger

from composer_dynsample.algorithms.embedding_table._training_set import (
    batch_indices,
    dataset_length,
    search_on_the_model_device,
    size_mismatch,
    train_labels,
    train_loader,
)
from composer_dynsample.algorithms.embedding_table.encodings import TableEncodings
from composer_dynsample.algorithms.embedding_table.fresh_rows import FreshRows
from composer_dynsample.algorithms.embedding_table.list_drift import ListDrift
from composer_dynsample.algorithms.embedding_table.node_rows import check_storage_dir, node_shared_rows
from composer_dynsample.algorithms.embedding_table.rows import (
    StagedWrites,
    class_centroids,
    staleness,
    table_fingerprint,
    write_rows,
)
from composer_dynsample.distributed import (
    all_gather_embeddings,
)
from composer_dynsample.mining.mined_batch import MinedBatch
from composer_dynsample.samplers.base import class_positions
from composer_dynsample.samplers.wiring import check_microbatches, find_epoch_target
from composer_dynsample.validation import check_bool, check_choice, check_int, parse_time

__all__ = ["EmbeddingTable", "class_centroids"]

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class EmbeddingTable(TableEncodings, Algorithm):
    """Keep one embedding per training sample, written by the forward pass, identical on every rank.

    At ``Event.AFTER_FORWARD`` the algorithm reads the step's embeddings (``state.outputs``, or the
    ``embeddings`` of a :class:`~composer_dynsample.MinedBatch` when mining ran first) and the batch's
    ``index``, gathers both from every rank and writes the rows; every row remembers the batch at which it
    was written. The table is part of the checkpoint. It is an algorithm of its own rather than an option
    of :class:`~composer_dynsample.HardNegativeMining` because samplers use it without any mining, and a
    miner without it.

    With ``refresh_interval`` set, at each epoch start that is a multiple of it, rows older than
    ``refresh_max_age`` batches (and rows never written) are re-embedded in one batched pass under
    ``no_grad`` in eval mode, each rank a share and the results gathered; the seconds and rows are logged
    as ``embedding_table/refresh_seconds`` and ``embedding_table/refreshed_rows``.

    With ``warm_start``, at ``FIT_START`` of a run that starts at step 0 every row is encoded by the
    starting model (the one encoding that offline mining pays), the same way: each rank a share, gathered,
    so every rank holds the same rows, stamped with step 0. The sampler then takes its first snapshot at
    the first epoch's start instead of the second's. The global random states (Python, NumPy, torch) are
    put back afterwards and eval mode uses no dropout and updates no BatchNorm statistics, so the run's
    batches and weights differ from a run without it only through what the sampler builds from the table.
    A resumed run never encodes: its table comes from the checkpoint. The rows and seconds are kept in
    :attr:`warm_start_cost` (and the checkpoint) and logged as ``embedding_table/warm_start_rows`` and
    ``embedding_table/warm_start_seconds``.

    At every epoch end (and at the end of a run that stops inside an epoch, a record marked ``partial``)
    the table's staleness is logged and kept in :attr:`history` (one dict per epoch,
    in the checkpoint, and in the CLI's ``metrics.json``): ``staleness_mean`` and ``staleness_max``, the
    batches since each written row was written, over ``rows_written`` rows of ``num_items``;
    ``rows_encoded`` and ``encode_seconds``, what the table encoded beyond the training forward passes in
    the epoch (the warm start's rows and the refreshes', ``0`` when the forward pass alone feeds it); with a
    sampler that reports what its epoch's plan did (``guard_counts``, as
    :class:`~composer_dynsample.samplers.MinedNegativesPKBatchSampler`), that too, under ``sampler``, with
    the summaries of the snapshots it took since the last record (its ``snapshot_log``) as ``snapshots``.

    Args:
        num_items (int, optional): Rows, the size of the training set. Default: read off the train
            dataloader's dataset at ``FIT_START``.
        dtype (str): ``"float32"``, ``"float16"`` or ``"bfloat16"``. Default: ``"float32"``.
        index_key (str): The batch key of the sample indices. Default: ``"index"``
            (what :class:`~composer_dynsample.data.GatherCollate` produces).
        device (str): Where the table lives. Default: ``"cpu"``.
        refresh_interval (str, optional): A time string in epochs (``"5ep"``). Default: ``None`` (no refresh).
        refresh_max_age (int): Rows written more than this many batches ago are refreshed. Default: ``0``
            (all rows).
        refresh_batch_size (int): Samples per forward pass of the refresh and of the warm start: what one
            pass holds at once (a transformer's activations grow with it times the text length).
            Default: ``1024``; a config run's default is ``evaluation.gallery_batch_size``.
        feed_sampler (bool): At every epoch start, hand the train batch sampler its snapshot when it takes
            one: class centroids (``update_class_embeddings``, as
            :class:`~composer_dynsample.samplers.HardClassPKBatchSampler` does) or the rows for nearest
            neighbours (``update_neighbours``, :class:`~composer_dynsample.samplers.NeighbourBatchSampler`,
            whose skipped false-negative candidates are logged as ``embedding_table/skipped_*``); a sampler with a
            ``snapshot_source`` attribute (:class:`~composer_dynsample.samplers.MinedNegativesPKBatchSampler`)
            gets the live rows for its refreshes within an epoch; keep the sampler's snapshot in the
            checkpoint so a resumed epoch is built from the same one. Default: ``True``.
        warm_start (bool): Encode the whole training set with the starting model at ``FIT_START`` of a run
            that starts at step 0, from the train loader's ``GatherCollate`` or ``TextCollate`` store, so the
            sampler's first snapshot is the first epoch's. Default: ``False``.
        stage_writes (bool, optional): Copy a step's rows to the table without waiting (see
            :class:`~composer_dynsample.algorithms.embedding_table.rows.StagedWrites`) and write them at
            ``BATCH_END``, before the next batch is drawn. Default: ``None``, when the embeddings are on a CUDA
            device and the table is not; the rows written are the same either way.
        fresh_rows_per_step (int): Re-encode this many rows at every ``BATCH_END`` with the model as it is
            then, in eval mode, the stalest first (:class:`~composer_dynsample.algorithms.embedding_table.fresh_rows.FreshRows`):
            an extra no-grad forward pass of that many samples a step. Default: ``0`` (none).
        fresh_upcoming (bool | str): Before the sampler searches a snapshot (at an epoch start or a refresh
            within one), re-encode the anchors and positives of the batches it applies to (the sampler's
            ``upcoming_rows``, as :class:`~composer_dynsample.samplers.MinedNegativesPKBatchSampler` has), so
            every anchor is ranked by the current model; ``"all"``: every row. Default: ``False``.
        list_drift (bool): A diagnostic: at each snapshot, how its candidate lists overlap the current model's
            (:mod:`~composer_dynsample.algorithms.embedding_table.list_drift`), in the epoch's record. Default: ``False``.
        storage_dir (str, optional): Hold the rows in one memory-mapped file per node in this folder, shared by
            the node's ranks (:mod:`~composer_dynsample.algorithms.embedding_table.node_rows`): one copy of the
            table per node instead of one per rank, the same rows and run. A table on the CPU only. The folder
            is created when missing; one that is a file, cannot be written or lacks room is a
            :class:`~composer_dynsample.algorithms.embedding_table.node_rows.StorageDirError` when the rows are
            allocated (or loaded from a checkpoint). Default: ``None`` (each rank's memory).

    Raises:
        ValueError: If an option is out of its range or of the wrong type (``storage_dir`` empty or not a path).

    Example:
        >>> from composer import Trainer
        >>> table = EmbeddingTable(dtype="float16")
        >>> trainer = Trainer(model=model, train_dataloader=loader, algorithms=[table],
        ...                   max_duration="2ep")  # doctest: +SKIP
        >>> centroids, counts = table.centroids(train_labels, num_classes)  # doctest: +SKIP
    """

    def __init__(
        self,
        num_items: int | None = None,
        *,
        dtype: str = "float32",
        index_key: str = "index",
        device: str = "cpu",
        refresh_interval: str | None = None,
        refresh_max_age: int = 0,
        refresh_batch_size: int = 1024,
        feed_sampler: bool = True,
        warm_start: bool = False,
        stage_writes: bool | None = None,
        fresh_rows_per_step: int = 0,
        fresh_upcoming: bool | str = False,
        list_drift: bool = False,
        storage_dir: str | None = None,
    ) -> None:
        self.num_items = check_int("num_items", num_items, minimum=1, allow_none=True)
        self._size_given = self.num_items is not None  # else read off the dataset at FIT_START
        self.dtype = _DTYPES[check_choice("dtype", dtype, tuple(_DTYPES))]
        if not isinstance(index_key, str) or not index_key:
            raise ValueError(f"index_key must be a non-empty string, got {index_key!r}.")
        self.index_key = index_key
        self.device = torch.device(device)
        self.storage_dir = check_storage_dir(storage_dir, device)
        self.refresh_every = None
        if refresh_interval is not None:
            from composer.core import TimeUnit

            self.refresh_every = int(
                parse_time("refresh_interval", refresh_interval, (TimeUnit.EPOCH,)).value
            )
            if self.refresh_every < 1:
                raise ValueError(f"refresh_interval must be at least 1ep, got {refresh_interval!r}.")
        self.refresh_max_age = check_int("refresh_max_age", refresh_max_age, minimum=0)
        self.refresh_batch_size = check_int("refresh_batch_size", refresh_batch_size, minimum=1)
        self.feed_sampler = check_bool("feed_sampler", feed_sampler)
        self.warm_start = check_bool("warm_start", warm_start)
        if stage_writes is not None:
            check_bool("stage_writes", stage_writes)
        self._staged = StagedWrites(stage_writes)
        self._fresh = FreshRows(fresh_rows_per_step, fresh_upcoming)
        self._drift = ListDrift() if check_bool("list_drift", list_drift) else None
        self._state: State | None = None  # the fit's state: the model and loader a fresh encoding reads
        #: The warm start's ``rows_encoded`` and ``seconds``; ``None`` until it ran (in the checkpoint).
        self.warm_start_cost: dict[str, float] | None = None
        self._encoded = {"rows": 0, "seconds": 0.0}  # encoded beyond the forward passes this epoch
        self.rows: torch.Tensor | None = None
        self.written_at: torch.Tensor | None = None
        self._sampler: Any = None  # the train batch sampler that takes class centroids, if any
        self._num_sampled: int | None = None  # a TextStore's sampled rows; its given negatives come after
        self._saved_sampler_state: dict[str, Any] | None = None
        #: One record per finished epoch: the table's staleness and what the sampler's plan did.
        self.history: list[dict[str, Any]] = []

    # ----------------------------------------------------------------------------------- the table itself
    def _allocate(self, dim: int) -> None:
        if self.num_items is None:
            raise RuntimeError(
                "EmbeddingTable: num_items is unknown; pass it or use a train dataloader with a dataset."
            )
        shape = (self.num_items, dim)
        if self.storage_dir is not None:
            self.rows = node_shared_rows(shape, self.dtype, self.storage_dir)
        else:
            self.rows = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.written_at = torch.full((self.num_items,), -1, dtype=torch.int64, device=self.device)

    def write(self, indices: torch.Tensor, embeddings: torch.Tensor, step: int) -> None:
        """Write rows (already gathered from every rank) and stamp them with ``step``."""
        if embeddings.ndim != 2:
            raise ValueError(
                f"EmbeddingTable: embeddings must be (batch, dim), got shape {tuple(embeddings.shape)}."
            )
        if self.rows is None or self.written_at is None:
            self._allocate(embeddings.shape[1])
        rows, written_at = self.rows, self.written_at
        if embeddings.shape[1] != rows.shape[1]:
            raise ValueError(
                f"EmbeddingTable: embeddings of dimension {embeddings.shape[1]} for a table of dimension "
                f"{rows.shape[1]}."
            )
        if indices.numel() and (int(indices.max()) >= rows.shape[0]):
            raise IndexError(
                f"EmbeddingTable: sample index {int(indices.max())} is outside a table of {rows.shape[0]} "
                "rows; num_items must be the size of the training set."
            )
        write_rows(rows, written_at, indices, embeddings, step)

    def centroids(
        self, labels: torch.Tensor, num_classes: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Class centroids of the written rows and their counts (see :func:`class_centroids`)."""
        if self.rows is None or self.written_at is None:
            raise RuntimeError("EmbeddingTable: no row has been written yet.")
        labels = torch.as_tensor(labels, dtype=torch.int64)
        classes = int(labels.max()) + 1 if num_classes is None else int(num_classes)
        return class_centroids(self.rows, self.written_at, labels, classes)

    def fingerprint(self) -> str:
        """A SHA-256 of the rows and their stamps: equal on two ranks exactly when their tables are equal."""
        return table_fingerprint(self.rows, self.written_at)

    # ------------------------------------------------------------------------------------------- Composer
    def staleness(self, step: int) -> dict[str, float]:
        """``rows_written`` and the mean and max batches since each written row was written, at ``step``."""
        return staleness(self.written_at, step)

    def match(self, event: Event, state: State) -> bool:
        if event in (Event.AFTER_FORWARD, Event.FIT_START, Event.EPOCH_END):
            return True
        if event == Event.FIT_END:  # a run that ends inside an epoch: its part-epoch record
            return int(state.timestamp.batch_in_epoch) > 0
        if event == Event.BATCH_END:
            return len(self._staged) > 0 or self._fresh.per_step > 0
        return event == Event.EPOCH_START and (self._refresh_due(state) or self._sampler is not None)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        self.apply_staged()  # before any read of the table, and at BATCH_END
        if event == Event.BATCH_END:
            if self._fresh.per_step and self.written_at is not None:
                self._encode_fresh(self._fresh.stalest(self.written_at), "fresh_rows_per_step")
            return
        if event == Event.FIT_START:
            self._fit_start(state, logger)
        elif event in (Event.EPOCH_END, Event.FIT_END):
            self._epoch_end(state, logger, partial=event == Event.FIT_END)
        elif event == Event.EPOCH_START:
            if self._refresh_due(state):
                self._refresh(state, logger)
            self._feed_sampler(state, logger)
        else:
            outputs = state.outputs
            embeddings = outputs.embeddings if isinstance(outputs, MinedBatch) else outputs
            if not isinstance(embeddings, torch.Tensor):
                raise TypeError(
                    "EmbeddingTable: state.outputs must be the (batch, dim) embeddings or a MinedBatch, got "
                    f"{type(embeddings).__name__}."
                )
            indices = batch_indices(state, self.index_key)
            if self._num_sampled is not None:  # a text batch's given negatives have no row: skipped
                indices = torch.where(indices < self._num_sampled, indices, -1)
            gathered, gathered_indices, _ = all_gather_embeddings(
                embeddings.detach(), indices, with_grad=False
            )
            if self._staged.wanted(gathered, self.device):  # written at BATCH_END: the copy does not wait
                self._staged.stage(
                    gathered_indices, gathered, step=int(state.timestamp.batch), dtype=self.dtype
                )
            else:
                self.write(gathered_indices, gathered, int(state.timestamp.batch))

    def _fit_start(self, state: State, logger: Logger) -> None:
        """Size the table, warm it, find the sampler to feed, and give it back its snapshot when resuming."""
        self._state = state
        store = getattr(getattr(train_loader(state), "collate_fn", None), "store", None)
        self._num_sampled = getattr(store, "num_sampled", None)
        if not self._size_given:
            # Composer loads a checkpoint before FIT_START: its table must fit the dataset read off now.
            length = dataset_length(state)
            if self.rows is not None and self.rows.shape[0] != length:
                raise size_mismatch(self.rows.shape[0], length)
            self.num_items = length
        if self.warm_start and self.warm_start_cost is None and int(state.timestamp.batch) == 0:
            self._warm_start(state, logger)
        if not self.feed_sampler:
            return
        target = find_epoch_target(state.train_dataloader)
        takes = any(
            callable(getattr(target, name, None)) for name in ("update_class_embeddings", "update_neighbours")
        )
        self._sampler = target if takes else None
        if self._sampler is not None:  # its hard classes or negatives must share a microbatch
            check_microbatches(state.train_dataloader, state.device_train_microbatch_size)
        if hasattr(self._sampler, "snapshot_source"):  # its refreshes within an epoch read the live table
            self._sampler.snapshot_source = self._snapshot_rows
        search_on_the_model_device(self._sampler, state.model)
        if self._sampler is not None and self._saved_sampler_state is not None:
            self._sampler.load_state_dict(self._saved_sampler_state)  # the interrupted epoch's centroids
            self._saved_sampler_state = None

    def apply_staged(self) -> None:
        """Write what :class:`StagedWrites` holds (nothing when the writes are not staged)."""
        if len(self._staged):
            self._staged.apply(self.write)

    def _snapshot_rows(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The rows as a sampler searches them, and which hold an embedding (``None`` before any); with
        ``fresh_upcoming``, the rows the snapshot applies to encoded first."""
        if self.rows is None or self.written_at is None:
            return None
        self._encode_upcoming()
        self._check_lists()
        return self.rows.float(), self.written_at >= 0

    def _epoch_end(self, state: State, logger: Logger, partial: bool = False) -> None:
        """Log the table's staleness and the sampler's plan counts, and keep them in :attr:`history`; at the
        end of a run that stops inside an epoch (``partial``), the record of that part, without the plan's
        counts (they are the whole epoch's)."""
        step = int(state.timestamp.batch)
        record: dict[str, Any] = {"epoch": int(state.timestamp.epoch), "step": step}
        if partial:
            record["partial"] = True
        record.update(self.staleness(step))
        record.update(rows_encoded=self._encoded["rows"], encode_seconds=self._encoded["seconds"])
        if self._fresh.per_step or self._fresh.upcoming:
            record.update(self._fresh.take_drift())
        self._encoded = {"rows": 0, "seconds": 0.0}
        logger.log_metrics(
            {f"embedding_table/{key}": value for key, value in record.items() if key != "epoch"}
        )
        if self._drift is not None:
            record["list_drift"] = self._drift.take()
        counts = getattr(self._sampler, "guard_counts", None)
        if callable(counts):
            record["sampler"] = {} if partial else {name: int(value) for name, value in counts().items()}
            record["sampler"]["refreshes"] = int(getattr(self._sampler, "refreshes", 0))
            logger.log_metrics({f"sampler/{name}": float(value) for name, value in record["sampler"].items()})
            log = getattr(self._sampler, "snapshot_log", [])
            seen = sum(len(earlier.get("sampler", {}).get("snapshots", [])) for earlier in self.history)
            record["sampler"]["snapshots"] = [dict(entry) for entry in log[seen:]]
        self.history.append(record)

    def _feed_sampler(self, state: State, logger: Logger) -> None:
        """Hand the table's snapshot to the sampler (class centroids, or the rows for nearest neighbours);
        it applies from the sampler's next ``set_epoch``."""
        if self._sampler is None or self.rows is None or self.written_at is None:
            return
        if callable(getattr(self._sampler, "update_neighbours", None)):
            self._encode_upcoming()
            self._check_lists()
            self._sampler.update_neighbours(self.rows.float(), self.written_at >= 0)
            skipped = getattr(self._sampler, "last_skipped", {})
            logger.log_metrics({f"embedding_table/skipped_{name}": float(n) for name, n in skipped.items()})
            return
        classes = np.asarray(self._sampler.classes)  # sorted, any integers
        dense, unknown = class_positions(classes, train_labels(state).cpu().long().numpy())
        if unknown.size:
            raise ValueError(
                f"EmbeddingTable: the training labels hold classes the sampler was not built with (e.g. "
                f"{unknown[:5].tolist()}); build {type(self._sampler).__name__} from the training dataset's labels."
            )
        self._sampler.update_class_embeddings(*self.centroids(torch.from_numpy(dense), classes.size))

    def state_dict(self) -> dict[str, Any]:
        self.apply_staged()
        state = super().state_dict()
        state["rows"] = None if self.rows is None else self.rows.cpu()
        state["written_at"] = None if self.written_at is None else self.written_at.cpu()
        state["num_items"] = self.num_items
        sampler_state = getattr(self._sampler, "state_dict", None)
        state["sampler"] = sampler_state() if callable(sampler_state) else None
        state["history"] = list(self.history)
        state["warm_start"] = self.warm_start_cost
        state["encoded"] = dict(self._encoded)
        state["fresh"] = self._fresh.state_dict()
        state["list_drift"] = None if self._drift is None else self._drift.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        rows = state.get("rows")
        if rows is not None and self._size_given and rows.shape[0] != self.num_items:
            raise size_mismatch(rows.shape[0], self.num_items)
        self.num_items = state.get("num_items", self.num_items)
        self.rows = None if rows is None else rows.to(device=self.device, dtype=self.dtype)
        if rows is not None and self.storage_dir is not None:  # every rank loads it: the node's file again
            self.rows = node_shared_rows(tuple(rows.shape), self.dtype, self.storage_dir).copy_(self.rows)
        written = state.get("written_at")
        self.written_at = None if written is None else written.to(self.device)
        self._saved_sampler_state = state.get("sampler")
        self.history = list(state.get("history", []))
        self.warm_start_cost = state.get("warm_start")
        self._encoded = dict(state.get("encoded") or {"rows": 0, "seconds": 0.0})
        self._fresh.load_state_dict(state.get("fresh") or {})
        if self._drift is not None:
            self._drift.load_state_dict(state.get("list_drift") or {})
