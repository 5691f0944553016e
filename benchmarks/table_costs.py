"""What online mined negatives cost on this CPU: table writes per step, searches, and forward passes.

The code-search recipe with mined corpus negatives (``yamls/code_search_mined.yaml``) trains one epoch
and a few batches of the next, in this process, twice:

1. **online** (the recipe): for every step, the step's time (``BATCH_START`` to ``BATCH_END``) and the
   time of ``EmbeddingTable``'s ``AFTER_FORWARD`` write (gather and copy of the step's embeddings), side
   by side in the same steps; the time of the snapshot's corpus search at the epoch start; and every row
   the encoder embeds (a forward hook), against the rows the batches hold.
2. **re-encode per refresh** (``embedding_table.refresh_interval=1ep``): the table re-embeds every row at
   the epoch start before the search, the way ANCE's second job re-encodes the corpus from a checkpoint
   for every refresh: its seconds and rows.

Goal: table writes at most 2% of a step. The forward passes spent on refreshing negatives are counted,
not assumed: the encoder's rows minus the batches' rows.

    python benchmarks/table_costs.py [--quick] [--threads 1]
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch
from _common import machine_info, markdown_table, parser, write_results
from composer.core import Callback, Event

CONFIG = str(Path(__file__).resolve().parents[1] / "yamls" / "code_search_mined.yaml")


class Costs(Callback):
    """Times every step, the table's write in it, the sampler's searches, and counts encoded rows."""

    def __init__(self) -> None:
        self.steps: list[float] = []
        self.writes: list[float] = []
        self.searches: list[float] = []
        self.refreshes: list[float] = []
        self.encoded = self.batch_rows = 0
        self._start = 0.0

    def fit_start(self, state, logger) -> None:
        from composer_dynsample.algorithms import EmbeddingTable

        table = next(a for a in state.algorithms if isinstance(a, EmbeddingTable))
        apply, refresh = table.apply, table._refresh

        def timed_apply(event, state, logger):
            start = time.perf_counter()
            result = apply(event, state, logger)
            if event == Event.AFTER_FORWARD:
                self.writes.append(time.perf_counter() - start)
            return result

        def timed_refresh(state, logger):
            start = time.perf_counter()
            refresh(state, logger)
            self.refreshes.append(time.perf_counter() - start)

        table.apply, table._refresh = timed_apply, timed_refresh
        sampler = table._sampler
        search = sampler._search

        def timed_search(*args):
            start = time.perf_counter()
            found = search(*args)
            self.searches.append(time.perf_counter() - start)
            return found

        sampler._search = timed_search
        encoder = state.model.encoder

        def count(module, inputs, output):
            self.encoded += int(output.shape[0])

        encoder.register_forward_hook(count)

    def batch_start(self, state, logger) -> None:
        self._start = time.perf_counter()
        self.batch_rows += int(state.batch["index"].numel())

    def batch_end(self, state, logger) -> None:
        self.steps.append(time.perf_counter() - self._start)


def train(overrides: list[str], batches: int) -> tuple[Costs, int]:
    from composer_dynsample.config import build_run, load_config

    costs = Costs()
    cfg = load_config(CONFIG, [f"trainer.max_duration={batches}ba", "trainer.progress_bar=false", *overrides])
    with tempfile.TemporaryDirectory(prefix="dynsample-costs-") as work:
        run = build_run(cfg, work, callbacks=[costs])
        run.trainer.fit()
        run.trainer.close()
        return costs, len(run.splits.train)


def main(argv: list[str] | None = None) -> dict:
    args = parser(__doc__, quick_help="a small corpus", threads=1).parse_args(argv)
    torch.set_num_threads(args.threads)
    quick = ["data.max_pairs_per_group=20"] if args.quick else []
    from composer_dynsample.config import build_run, load_config

    probe = build_run(load_config(CONFIG, [*quick, "trainer.max_duration=1ba"]), tempfile.mkdtemp())
    per_epoch = len(probe.trainer.state.train_dataloader)
    del probe
    batches = per_epoch + 5  # an epoch to fill the table, then the snapshot and a few batches
    online, rows = train(quick, batches)
    reencoded, _ = train([*quick, "algorithms.embedding_table.refresh_interval=1ep"], batches)
    step = statistics.median(online.steps)
    write = statistics.median(online.writes)
    epoch_s = sum(online.steps[:per_epoch])
    search_s = online.searches[0] if online.searches else float("nan")
    refresh_s = reencoded.refreshes[0] if reencoded.refreshes else float("nan")
    extra_rows = online.encoded - online.batch_rows
    result = {
        "ratio": write / step,
        "ratio_meaning": "median table write (AFTER_FORWARD) / median training step, the same steps",
        "step_ms": 1000 * step,
        "table_write_ms": 1000 * write,
        "table_rows": rows,
        "epoch_s": epoch_s,
        "search_s": search_s,
        "search_share_of_epoch": search_s / epoch_s,
        "encoded_rows": online.encoded,
        "batch_rows": online.batch_rows,
        "extra_encoded_rows": extra_rows,
        "reencode_s": refresh_s,
        "reencode_rows": reencoded.encoded - reencoded.batch_rows,
        "reencode_share_of_epoch": refresh_s / epoch_s,
        "batches_per_epoch": per_epoch,
        "threads": args.threads,
        "machine": machine_info(),
    }
    rows_table = [
        ["training step (median)", f"{1000 * step:.1f} ms", "-"],
        ["table write in the step (median)", f"{1000 * write:.2f} ms", f"{100 * write / step:.2f}% of a step (goal <= 2%)"],
        ["corpus search for a snapshot", f"{search_s:.2f} s", f"{100 * search_s / epoch_s:.1f}% of an epoch"],
        ["extra encoder rows for refreshing", f"{extra_rows}", f"{online.encoded} rows encoded, {online.batch_rows} in batches"],
        ["re-encoding the corpus per refresh (ANCE)", f"{refresh_s:.2f} s", f"{reencoded.encoded - reencoded.batch_rows} rows, {100 * refresh_s / epoch_s:.1f}% of an epoch"],
    ]  # fmt: skip
    text = (
        f"Online mined negatives on code search ({rows} table rows, {per_epoch} batches an epoch, "
        f"{args.threads} thread(s)): the same steps, side by side.\n\n"
        + markdown_table(["cost", "measured", "relative"], "lrl", rows_table)
    )
    print(text)
    return write_results(args.out, "table_costs", args.quick, result, text)


if __name__ == "__main__":
    main()
