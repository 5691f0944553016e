"""Checks 2 to 4 of ``gpu.py``: what a training run does on the device.

``training`` trains the digits_quick recipe through the CLI at each precision; ``pin_memory`` copies
DataLoader batches to the device, pinned and not; ``transformer`` times a text encoder's training step in
fp32 and under bf16 autocast. Each takes the device first and its sizes as keywords (``gpu.py``'s plans).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from _common import time_interleaved
from _cuda import one_line, synchronize

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "yamls" / "digits_quick.yaml"
PRECISIONS = ("fp32", "amp_fp16", "amp_bf16")
AUTOCAST = {"fp32": None, "bf16 autocast": torch.bfloat16}


# --- 2. training through the CLI ---------------------------------------------------------------------


def trainer_device(device: torch.device) -> str:
    """Composer's name for ``device`` (``trainer.device``): ``gpu`` for CUDA, else the torch name."""
    return "gpu" if device.type == "cuda" else device.type


def training_arguments(precision: str, device: str, run_dir: Path, epochs: int) -> list[str]:
    """The CLI's arguments (``python -m composer_dynsample ...``) training digits_quick for ``epochs``."""
    return [
        "train", str(RECIPE),
        f"trainer.precision={precision}", f"trainer.device={device}", f"trainer.max_duration={epochs}ep",
        f"evaluation.interval={epochs}ep", f"trainer.save_interval={epochs}ep",
        "--run-dir", str(run_dir), "--quiet",
    ]  # fmt: skip


def training_row(precision: str, device: str, run_dir: Path, epochs: int) -> dict:
    """Train once through the CLI's ``main`` in this process: the exit code, the final metrics and the
    seconds per epoch, or the error's last line."""
    from composer_dynsample.cli.main import main

    row: dict[str, Any] = {"precision": precision}
    start, errors = time.perf_counter(), io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            main(training_arguments(precision, device, run_dir, epochs))
        code = 0
    except SystemExit as stop:  # the CLI's own exit: 2 for a refused config, with its one-line error
        code = stop.code if isinstance(stop.code, int) else 1
    except Exception as error:  # a failure the CLI does not catch (a CUDA error, say)
        return {**row, "exit_code": 1, "error": one_line(error)}
    row.update(exit_code=code, run_s=time.perf_counter() - start)
    if code != 0:
        lines = [line for line in errors.getvalue().splitlines() if line.strip()]
        return {**row, "error": lines[-1] if lines else "no output"}
    metrics = json.loads((run_dir / "metrics.json").read_text())
    epochs_run = max(int(metrics.get("epochs_this_run", epochs)), 1)
    row.update(
        recall_at_1=metrics["recall_at_1"],
        map_at_r=metrics["map_at_r"],
        fit_s=metrics["wall_time_s"],
        s_per_epoch=metrics["wall_time_s"] / epochs_run,
        device=metrics.get("device"),
    )
    return row


def check_training(device: torch.device, epochs: int, precisions: Sequence[str] = PRECISIONS) -> dict:
    """One CLI training run per precision, one after the other in this process, each in its own run
    directory: Composer's import (most of a process's start-up) is paid once, not once per precision."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as folder:
        rows = [training_row(p, trainer_device(device), Path(folder) / p, epochs) for p in precisions]
    failed = [row for row in rows if row["exit_code"] != 0]
    done = ", ".join(
        f"{row['precision']} R@1 {row['recall_at_1']:.3f} at {row['s_per_epoch']:.2f} s/epoch"
        for row in rows
        if row["exit_code"] == 0
    )
    summary = f"{epochs} epoch{'s' if epochs != 1 else ''} of digits_quick: {done or 'no run finished'}"
    if failed:
        summary += "; failed: " + ", ".join(f"{row['precision']} ({row['error']})" for row in failed)
    return {"status": "failed" if failed else "ok", "summary": summary, "rows": rows}


# --- 3. pin_memory ---------------------------------------------------------------------------------


def make_loaders(rows: int, image: int, batch: int, workers: Sequence[int], pins: Sequence[bool]) -> dict:
    """DataLoaders over one random image store, keyed ``(workers, pin_memory)``."""
    from composer_dynsample.data import GatherCollate, IndexDataset, TensorStore

    generator = torch.Generator().manual_seed(0)
    store = TensorStore(torch.rand(rows, 1, image, image, generator=generator), torch.arange(rows) % 100)
    return {
        (w, pin): torch.utils.data.DataLoader(
            IndexDataset(store.labels),
            batch_size=batch,
            collate_fn=GatherCollate(store),
            pin_memory=pin,
            num_workers=w,
            persistent_workers=w > 0,
        )
        for w in workers
        for pin in pins
    }


def copy_epoch(loader: torch.utils.data.DataLoader, device: torch.device) -> int:
    """Iterate the loader once, copying every batch to the device; returns the bytes copied."""
    copied = 0
    for batch in loader:
        features = batch["features"].to(device, non_blocking=loader.pin_memory)
        batch["labels"].to(device, non_blocking=loader.pin_memory)
        copied += features.numel() * features.element_size()
    synchronize(device)
    return copied


def check_pin_memory(
    device: torch.device,
    rows: int,
    image: int,
    batch: int,
    rounds: int,
    pins: Sequence[bool] = (False, True),
    workers: Sequence[int] = (0, 2),
) -> dict:
    """Batches per second copied to ``device``, per (workers, pin_memory), timed interleaved by epoch."""
    loaders = make_loaders(rows, image, batch, workers, pins)
    pinned = {key: bool(next(iter(loader))["features"].is_pinned()) for key, loader in loaders.items()}
    fns = {
        f"{w}/{pin}": (lambda loader=loader: copy_epoch(loader, device))
        for (w, pin), loader in loaders.items()
    }
    times = time_interleaved(fns, rounds)
    mib = copy_epoch(next(iter(loaders.values())), device) / 2**20
    out = [
        {
            "workers": w,
            "pin_memory": pin,
            "batches_pinned": pinned[(w, pin)],
            "batches_per_s": len(loaders[(w, pin)]) / times[f"{w}/{pin}"],
            "mib_per_s": mib / times[f"{w}/{pin}"],
        }
        for w, pin in loaders
    ]
    speed = {(row["workers"], row["pin_memory"]): row["batches_per_s"] for row in out}
    summary = ", ".join(
        f"{w} workers: pinned {speed[(w, True)] / speed[(w, False)]:.2f}x the unpinned batches/s"
        for w in workers
        if (w, True) in speed and (w, False) in speed
    )
    not_pinned = [row["workers"] for row in out if row["pin_memory"] and not row["batches_pinned"]]
    if not_pinned:
        summary += f"; pin_memory=True gave unpinned batches with workers {not_pinned}"
    return {"status": "failed" if not_pinned else "ok", "summary": summary or "measured", "rows": out}


# --- 4. the transformer text encoder ---------------------------------------------------------------


def bert_config(layers: int, hidden: int) -> dict[str, Any]:
    """A small random-init BERT for ``TransformerEncoder(config=...)``: 64-wide heads, 4x feed-forward."""
    return {
        "model_type": "bert",
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": max(hidden // 64, 1),
        "intermediate_size": 4 * hidden,
    }


def transformer_step(
    device: torch.device, config: dict, batch: int, length: int, autocast: torch.dtype | None
):
    """A closure taking one training step of an EmbeddingModel(TransformerEncoder, InfoNCELoss)."""
    from composer_dynsample import EmbeddingModel, InfoNCELoss
    from composer_dynsample.models.text import TransformerEncoder

    vocab = 30522
    torch.manual_seed(0)
    encoder = TransformerEncoder(config=config, vocab_size=vocab, pooling="mean", embedding_dim=128)
    model = EmbeddingModel(encoder, InfoNCELoss()).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, length), generator=generator)
    features = {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device)}
    data = {"features": features, "labels": (torch.arange(batch) // 2).to(device)}
    losses: list[float] = []

    def step() -> None:
        context = torch.autocast(device.type, dtype=autocast) if autocast else contextlib.nullcontext()
        with context:
            loss = model.loss(model(data), data)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses[:] = [loss.detach()]

    return step, losses


def step_peak_mib(step: Callable[[], None], device: torch.device) -> float | None:
    """The memory one step allocates above what was allocated before it, at its peak (CUDA only)."""
    if device.type != "cuda":
        return None
    synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20


def check_transformer(
    device: torch.device,
    layers: int,
    hidden: int,
    batch: int,
    length: int,
    steps: int,
    rounds: int,
    precisions: Sequence[str] = tuple(AUTOCAST),
) -> dict:
    """Steps per second in each of ``precisions`` (keys of :data:`AUTOCAST`: fp32, bf16 autocast), timed
    interleaved, and each step's peak memory."""
    try:
        from composer_dynsample.models.text import TransformerEncoder, import_text_extra  # noqa: F401

        import_text_extra("transformers", "the transformer check")
    except ImportError as error:
        return {"status": "skipped", "reason": one_line(error)}
    modes = {name: AUTOCAST[name] for name in precisions}
    if "bf16 autocast" in modes and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        del modes["bf16 autocast"]
    config = bert_config(layers, hidden)
    made = {name: transformer_step(device, config, batch, length, dtype) for name, dtype in modes.items()}
    peaks = {}
    for name, (step, _) in made.items():
        step()  # warm-up: lazy initialisation, optimizer state, kernel selection
        peaks[name] = step_peak_mib(step, device)

    def block(step: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            for _ in range(steps):
                step()
            synchronize(device)

        return run

    times = time_interleaved({name: block(step) for name, (step, _) in made.items()}, rounds)
    rows = [
        {"precision": name, "steps_per_s": steps / times[name], "step_peak_mib": peaks[name],
         "final_loss": float(losses[-1])}
        for name, (_, losses) in made.items()
    ]  # fmt: skip
    finite = all(math.isfinite(row["final_loss"]) for row in rows)
    summary = ", ".join(
        f"{r['precision']} {r['steps_per_s']:.1f} steps/s"
        + (f", {r['step_peak_mib']:.0f} MiB per step" if r["step_peak_mib"] is not None else "")
        for r in rows
    )
    shape = f"BERT {layers} layers x {hidden}, B = {batch}, L = {length}: "
    return {"status": "ok" if finite else "failed", "summary": shape + summary, "rows": rows}
