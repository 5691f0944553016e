"""What ``train`` does with a built run: fit it, score the test split and write rank 0's report.

:func:`evaluate_run` scores the run's current model by the data's protocol (at the end of ``train``, and
for ``eval`` with a checkpoint's weights or the model as built). With ``evaluation.at_start`` the
starting model is scored too, before the first step, without touching the random state the training
draws from; :func:`start_metrics_keeper` keeps its metrics in the run's checkpoints. A training run's
report is ``metrics.json`` (the metrics, times and what the run was), ``embeddings.png`` (not for text
pairs, where a point per pair says little), ``retrievals.png`` for image data, the metrics table (the
starting model's column beside the final one) and a summary line counting the epochs, or the batches of a
``trainer.max_duration`` not in epochs; a warning line on stderr when a mined-negatives sampler had no
snapshot of the model in the whole run (its negatives were random). A signal during the fit ends it with
:class:`Interrupted`. The commands of :mod:`composer_dynsample.cli.commands` call these;
:class:`Interrupted` and :func:`evaluate_run` are importable from there too.
"""

from __future__ import annotations

import contextlib
import numbers
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

# Only modules that load neither torch nor Composer are imported here; the others are imported in the
# functions that use them, so --help and config errors answer before torch and Composer load.
from composer_dynsample.cli.progress import set_progress_lines
from composer_dynsample.cli.resume import interrupt_message
from composer_dynsample.cli.run_dir import is_rank_zero
from composer_dynsample.config.components import ConfigError
from composer_dynsample.config.loading import evaluation_config, save_config
from composer_dynsample.config.run_tokenizer import write_run_tokenizer

__all__ = [
    "Interrupted",
    "evaluate_run",
    "fit_and_report",
    "plot_run_retrievals",
    "report_evaluation",
    "start_metrics_keeper",
]


class Interrupted(Exception):
    """``train`` stopped on ``SIGINT`` or ``SIGTERM`` after saving a checkpoint; the message says how to resume.

    Attributes:
        exit_code (int): ``128 + signal``: ``130`` for ``SIGINT`` (Ctrl-C), ``143`` for ``SIGTERM``.
        checkpoint (str | None): The checkpoint saved (on rank 0).
    """

    def __init__(self, message: str, exit_code: int, checkpoint: str | None = None) -> None:
        super().__init__(message)
        self.exit_code, self.checkpoint = exit_code, checkpoint


def _check_duration_left(run: Any) -> None:
    """A resumed run whose checkpoint already reached ``max_duration``: say what to raise, in one line."""
    state = run.trainer.state
    duration = state.max_duration
    elapsed = int(state.timestamp.get(duration.unit))
    if int(duration.value) <= elapsed:
        raise ConfigError(
            f"the checkpoint has already trained {elapsed}{duration.unit.value} and trainer.max_duration is "
            f"{duration}: nothing is left to train. Raise trainer.max_duration (e.g. "
            f"trainer.max_duration={elapsed + max(1, int(duration.value) // 2)}{duration.unit.value}) to continue."
        )


def evaluate_run(run: Any) -> tuple[dict[str, float], Any]:
    """Score the test split with the run's current model, by the data's protocol.

    Test queries against the train gallery; every test item against the other test items when the
    test classes are not in the train split (glyphs, labelled texts); the test queries against the
    test passages for text pairs (see :mod:`composer_dynsample.config.evaluation`). Every rank computes
    the same result: the queries and gallery are whole on each rank, and rank 0's buffers are
    broadcast first.

    Args:
        run (TrainingRun): A run from :func:`composer_dynsample.config.build_run`.

    Returns:
        tuple[dict[str, float], torch.Tensor]: The metrics (``recall_at_{k}`` per ``k``, ``map_at_r`` and
        ``r_precision``; for pairs ``mrr``, ``mrr_at_10``, ``recall_at_{k}``, ``ndcg_at_10`` and
        ``csn_mrr``), ``queries_without_positive`` of ``num_queries`` (the queries every metric leaves
        out), with ``evaluation.matryoshka_dims`` (else ``model.loss.matryoshka_dims``) the same metrics
        at each narrower dimension under ``matryoshka``, and the queries' embeddings.
    """
    from composer_dynsample.config.evaluation import final_metrics
    from composer_dynsample.config.matryoshka import evaluation_dims
    from composer_dynsample.distributed import broadcast_buffers

    model = run.trainer.state.model
    broadcast_buffers(model)  # every rank evaluates rank 0's model (BatchNorm statistics differ per rank)
    queries, gallery = run.batch_sizes
    dims = evaluation_dims(run.config)  # Matryoshka dimensions: their metrics under "matryoshka"
    return final_metrics(
        model, run.splits, run.ks, run.distance, batch_size=queries, gallery_batch_size=gallery, dims=dims
    )


#: The name of :func:`start_metrics_keeper`'s callback: the key of its state in a checkpoint.
_KEEPER = "StartMetrics"


def start_metrics_keeper() -> Any:
    """A Composer callback that keeps the starting model's metrics in every checkpoint of the run.

    ``train`` adds one to its run; :func:`fit_and_report` sets its ``metrics`` when it scores the
    starting model (``evaluation.at_start``). A resumed run does not score the model it resumes (that is
    no longer the starting model): it reads them back from the checkpoint and reports them again, or
    ``None`` when the run that saved the checkpoint did not score its start. Its state, saved under the
    key ``StartMetrics``, holds numbers and ``None`` only.

    Returns:
        composer.core.Callback: The callback, its ``metrics`` ``None``.
    """
    from composer.core import Callback

    class StartMetrics(Callback):
        """The starting model's metrics (``None`` until scored), saved in and loaded from checkpoints."""

        def __init__(self) -> None:
            self.metrics: dict[str, float] | None = None

        def state_dict(self) -> dict[str, Any]:
            return {"metrics": self.metrics}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self.metrics = state.get("metrics")

    StartMetrics.__qualname__ = _KEEPER  # Composer keys a callback's state by its qualified name
    return StartMetrics()


@contextlib.contextmanager
def _random_state_kept() -> Iterator[None]:
    """Restore Python's, numpy's and torch's global random states (CPU, and CUDA when in use) on exit."""
    import random

    import numpy as np
    import torch

    python, numpy, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def _plain_numbers(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The metrics as Python numbers (``matryoshka``'s per dimension too): what a checkpoint may hold and
    ``metrics.json`` writes."""
    return {
        name: _plain_numbers(value)
        if isinstance(value, Mapping)
        else int(value)
        if isinstance(value, numbers.Integral)
        else float(value)
        for name, value in metrics.items()
    }


def _logged(prefix: str, metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The metrics as the loggers take them, one number a name: ``matryoshka``'s as ``prefix/matryoshka/64/mrr``."""
    flat: dict[str, Any] = {}
    for name, value in metrics.items():
        flat.update(
            _logged(f"{prefix}/{name}", value) if isinstance(value, Mapping) else {f"{prefix}/{name}": value}
        )
    return flat


def _score_start(run: Any, start_batch: int) -> tuple[dict[str, Any] | None, float | None]:
    """``(the starting model's metrics, seconds spent)``: scored now when ``evaluation.at_start`` is on
    and the run starts at batch 0 (every rank scores it), else what the run's ``StartMetrics`` callback
    (:func:`start_metrics_keeper`) read from the checkpoint it resumed."""
    callbacks = run.trainer.state.callbacks
    keeper = next((item for item in callbacks if type(item).__qualname__ == _KEEPER), None)
    kept = keeper.metrics if keeper is not None else None
    if start_batch > 0 or not evaluation_config(run.config).at_start:
        return (dict(kept) if kept is not None else None), None
    started = time.perf_counter()
    with _random_state_kept():  # the training draws the same batches and dropout masks as without it
        metrics = _plain_numbers(evaluate_run(run)[0])
    if keeper is not None:
        keeper.metrics = dict(metrics)
    run.trainer.logger.log_metrics(_logged("at_start", metrics))
    return metrics, round(time.perf_counter() - started, 3)


def fit_and_report(
    run: Any,
    interrupt: Any,
    resume: Any,
    config_path: Path | None,
    overrides: Sequence[str],
    started: float,
    *,
    quiet: bool,
) -> dict[str, Any]:
    """Write the config, score the starting model when asked, fit (turning a signal into
    :class:`Interrupted`; with progress lines when stdout is not a terminal, unless ``quiet``), evaluate
    and report.

    With ``evaluation.at_start: true`` every rank scores the starting model before the first step; the
    random state the training draws from is restored afterwards, so the training is the same as without
    it. ``metrics.json`` holds those metrics under ``at_start`` (``None`` when not scored) and the table
    shows them beside the final ones. A resumed run does not score again: it reports what its
    checkpoint recorded, when the run has a :func:`start_metrics_keeper` callback.
    """
    from composer.utils import dist

    from composer_dynsample.callbacks.checkpoint_on_interrupt import TrainingInterrupted

    _check_duration_left(run)
    if is_rank_zero():
        save_config(run.config, run.run_dir / "config.yaml")
        write_run_tokenizer(run.splits, run.run_dir)  # text data: eval, embed and export read it back
    state = run.trainer.state
    start_batch, start_epoch = int(state.timestamp.batch), int(state.timestamp.epoch)
    at_start, at_start_seconds = _score_start(run, start_batch)
    set_progress_lines(run, quiet)  # without a terminal: a plain line now and then (cli/progress.py)
    fit_start = time.perf_counter()
    try:
        with interrupt.catching_signals():
            run.trainer.fit()
    except TrainingInterrupted as stop:
        run.trainer.close()
        command = resume(stop.checkpoint, run.run_dir, dist.get_world_size()) if stop.checkpoint else None
        raise Interrupted(interrupt_message(stop, command), stop.exit_code, stop.checkpoint) from None
    fit_seconds = time.perf_counter() - fit_start
    final, test_embeddings = evaluate_run(run)
    run.trainer.logger.log_metrics(_logged("final", final))
    metrics = {
        **final,
        "at_start": at_start,
        "at_start_time_s": at_start_seconds,
        "wall_time_s": round(fit_seconds, 3),
        "total_time_s": round(time.perf_counter() - started, 3),
        **_run_record(run, config_path, overrides, start_epoch=start_epoch, start_batch=start_batch),
    }
    if is_rank_zero():
        _report(run, metrics, final, test_embeddings, quiet=quiet)
    run.trainer.close()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
    return metrics


def _run_record(
    run: Any, config_path: Path | None, overrides: Sequence[str], *, start_epoch: int, start_batch: int
) -> dict[str, Any]:
    """What ``metrics.json`` says about the run besides its metrics and times."""
    from composer.utils import dist

    from composer_dynsample.config.evaluation import describe_protocol, query_rows

    state = run.trainer.state
    saved = [str(run.local_path(path)) for path in getattr(run.trainer, "saved_checkpoints", [])]
    protocol, gallery_size = describe_protocol(run.splits)
    return {
        "seed": run.seed,
        "epochs": int(state.timestamp.epoch),
        "batches": int(state.timestamp.batch),
        "epochs_this_run": int(state.timestamp.epoch) - start_epoch,
        "resumed_from_epoch": start_epoch,
        "resumed_from_batch": start_batch,
        "max_duration": str(run.config.trainer.max_duration),
        "config": str(config_path) if config_path is not None else None,
        "overrides": list(overrides),
        "run_dir": str(run.run_dir),
        "dataset": run.splits.test_name,  # what the metrics score: a test file's stem (data.test_path)
        "train_dataset": run.splits.name,
        "class_names": run.splits.class_names,
        "num_queries": len(query_rows(run.splits)),
        "gallery_size": gallery_size,
        "protocol": protocol,
        "world_size": dist.get_world_size(),
        "device": type(state.device).__name__,
        "precision": str(getattr(state.precision, "value", state.precision)),
        # What the run took from its device because the config did not say (config/device.py).
        "device_defaults": dict(getattr(run, "device_defaults", {})),
        "checkpoint": saved[-1] if saved else None,
        "load_path": run.config.trainer.get("load_path"),
        "eval_history": run.gallery.history if run.gallery is not None else [],
        **_table_record(state),
    }


def _table_record(state: Any) -> dict[str, Any]:
    """The embedding table's per-epoch staleness and sampler counts (``embedding_table``) and the cost of its
    warm start (``embedding_table_warm_start``: rows encoded and seconds, also for a run shorter than an
    epoch, which has no epoch record); ``None`` for each when the run has no table or no warm start."""
    from composer_dynsample.algorithms import EmbeddingTable

    tables = [algorithm for algorithm in state.algorithms if isinstance(algorithm, EmbeddingTable)]
    table = tables[0] if tables else None
    return {
        "embedding_table": table.history if table is not None else None,
        "embedding_table_warm_start": table.warm_start_cost if table is not None else None,
    }


def plot_run_retrievals(run: Any, test_embeddings: Any, path: Path, when: str) -> None:
    """For image data, a grid of test queries and their 5 nearest test items, marked right or wrong."""
    from composer_dynsample.cli.plots import plot_retrievals

    store = run.splits.test
    if len(getattr(store, "feature_shape", ())) != 3:  # (C, H, W) images only
        return
    title = f"{run.splits.test_name}: test queries and their nearest other test items ({when}); green = same class"
    plot_retrievals(
        store.features,
        store.labels,
        test_embeddings,
        path,
        distance=run.distance,
        title=title,
        class_names=run.splits.class_names,
    )


def report_evaluation(run: Any, result: dict[str, Any], path: Path, model: str) -> None:
    """Rank 0's json and table of ``eval``: ``result`` (the metrics, ``checkpoint`` and ``dataset``) written
    to ``path``, and the metrics table titled by the data and ``model`` (what was scored)."""
    from composer_dynsample.cli.matryoshka_table import format_matryoshka_table
    from composer_dynsample.cli.reporting import format_metrics_table, write_json
    from composer_dynsample.cli.sources_table import format_sources_table
    from composer_dynsample.config.evaluation import describe_protocol

    write_json(path, result)
    metrics = {name: value for name, value in result.items() if name not in ("checkpoint", "dataset")}
    title, gallery_size = f"{run.splits.test_name}: {model}", describe_protocol(run.splits)[1]
    if metrics.get("sources"):  # a mix of data sets: a column a source
        print(format_sources_table(metrics, title))
    else:
        print(format_metrics_table(metrics, title=title, gallery_size=gallery_size))
    if metrics.get("matryoshka"):
        print("\n" + format_matryoshka_table(metrics, gallery_size=gallery_size))
    print(f"wrote {path}")


def _report(
    run: Any, metrics: dict[str, Any], final: dict[str, float], test_embeddings: Any, *, quiet: bool
) -> None:
    """Rank 0's outputs of a training run: metrics.json, embeddings.png (not for pairs), the table and one
    summary line."""
    from composer_dynsample.cli.matryoshka_table import format_matryoshka_table
    from composer_dynsample.cli.plots import plot_embeddings
    from composer_dynsample.cli.reporting import format_metrics_table, metrics_table_title, write_json
    from composer_dynsample.cli.sources_table import format_sources_table

    write_json(run.run_dir / "metrics.json", metrics)
    title = f"{run.splits.test_name} test embeddings (PCA), epoch {metrics['epochs']}"
    if final.get("recall_at_1") is not None:
        train_gallery = metrics["protocol"] == "test queries vs train gallery"
        against = "vs train gallery" if train_gallery else "leave-one-out among the test items"
        title += f"\nRecall@1 {against} = {final['recall_at_1']:.4f}"
    scored_apart = metrics["protocol"] in (
        "test queries vs test passages",
        "each source on its own test split",
    )
    if not scored_apart:  # pairs: a point per pair says little; a mix's sources are scored apart
        plot_embeddings(
            test_embeddings,
            run.splits.test.labels,
            run.run_dir / "embeddings.png",
            title=title,
            class_names=run.splits.class_names,
        )
    plot_run_retrievals(run, test_embeddings, run.run_dir / "retrievals.png", f"epoch {metrics['epochs']}")
    if not quiet:
        table_title = metrics_table_title(
            run.splits.test_name, metrics["num_queries"], metrics["protocol"], metrics["gallery_size"]
        )
        table = (
            format_sources_table(final, f"{run.splits.name}: final retrieval metrics, each source on its own")
            if final.get("sources")
            else format_metrics_table(
                final, title=table_title, gallery_size=metrics["gallery_size"], start=metrics["at_start"]
            )
        )
        print("\n" + table)
        if final.get("matryoshka"):
            print("\n" + format_matryoshka_table(final, gallery_size=metrics["gallery_size"]))
    print(f"{_trained(metrics, run.trainer.state.max_duration.unit.value)}; wrote {run.run_dir}")
    warning = _unmined_warning(run)
    if warning is not None:
        print(f"warning: {warning}", file=sys.stderr)


def _trained(metrics: Mapping[str, Any], unit: str) -> str:
    """The summary's count of what the run trained, in the unit of ``trainer.max_duration``: epochs for
    ``ep``, batches for ``ba`` and ``sp`` (a run of samples stops at the batch that reaches them)."""
    seconds, start = f"in {metrics['wall_time_s']:.1f} s", metrics["resumed_from_batch"]
    if unit == "ep":
        resumed = f" (resumed at epoch {metrics['resumed_from_epoch']})" if start else ""
        noun = "epoch" if metrics["epochs_this_run"] == 1 else "epochs"
        return f"trained {metrics['epochs_this_run']} {noun}{resumed} to epoch {metrics['epochs']} {seconds}"
    count = metrics["batches"] - start
    resumed = f" (resumed at batch {start})" if start else ""
    noun = "batch" if count == 1 else "batches"
    return f"trained {count} {noun}{resumed} to batch {metrics['batches']} {seconds}"


def _unmined_warning(run: Any) -> str | None:
    """What to say when the train sampler mines its negatives from the embedding table's snapshots
    (it keeps a ``snapshot_log``) and none was ever taken, so every anchor's negatives were random; ``None``
    otherwise, and for a table with ``feed_sampler: false`` (random negatives on purpose).

    The sampler's ``snapshot_log`` comes back from the checkpoint of a resumed run, so it is empty only
    when no snapshot was in force at any step of the run.
    """
    from composer_dynsample.algorithms import EmbeddingTable
    from composer_dynsample.samplers.wiring import find_epoch_target

    state = run.trainer.state
    sampler = find_epoch_target(state.train_dataloader)
    log = getattr(sampler, "snapshot_log", None)
    if log is None or len(log) > 0:
        return None
    if any(isinstance(item, EmbeddingTable) and not item.feed_sampler for item in state.algorithms):
        return None
    name = run.config.get("sampler", {}).get("name") or type(sampler).__name__
    return (
        f"the {name} sampler had no snapshot of the model during this run, so every anchor's negatives "
        "were random; set algorithms.embedding_table.warm_start: true (on the command line: "
        "algorithms.embedding_table.warm_start=true) to mine them from the first step."
    )
