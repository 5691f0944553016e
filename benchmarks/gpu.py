"""What has a CUDA path in this package, run on a GPU: equal to the CPU, and how fast?

Six checks, each independent (one that fails records its error and the others still run):

1. ``miners``: every miner of :mod:`composer_dynsample.mining` on the same clustered, L2-normalised
   float32 embeddings (D = 128, 16 per class) on the CPU and on CUDA, compared as sorted sets of tuples
   (``distance_weighted`` with the same seeded CPU generator on both; ``random_triplets``, whose CUDA
   generator is another algorithm than the CPU's, is checked for determinism, validity and the same
   anchors instead). A difference counts as a tie when the float64 distances show the two choices within
   1e-5 of each other or of the miner's threshold (``_mined_tuples.py``); anything else is a failure.
   fp16 and bf16 inputs are compared on CUDA with their own float32 copies (the package promises the
   same tuples except at ties). Times: median per call on the CPU and on CUDA (synchronised), timed
   interleaved, at B = 1024 and 4096.
2. ``training``: ``python -m composer_dynsample train yamls/digits_quick.yaml trainer.device=gpu
   trainer.precision=P`` for P in fp32, amp_fp16, amp_bf16 (the ``trainer`` keys are Composer
   ``Trainer`` arguments), each in a temporary run directory: exit code, final Recall@1 and MAP@R, and
   seconds per epoch (``wall_time_s`` of ``metrics.json``, ``Trainer.fit`` alone, over the epochs).
3. ``pin_memory``: a DataLoader over :class:`~composer_dynsample.data.IndexDataset` and
   :class:`~composer_dynsample.data.GatherCollate` (B = 512 images of 64 x 64) whose batches are copied
   to the GPU (``non_blocking`` when pinned): batches per second with ``pin_memory`` True and False,
   with 0 and 2 workers, timed interleaved.
4. ``transformer``: a 4-layer BERT (hidden 256) :class:`~composer_dynsample.models.text.TransformerEncoder`
   inside :class:`~composer_dynsample.EmbeddingModel` with :class:`~composer_dynsample.InfoNCELoss`, on
   random token batches of B = 128, L = 128 (each label twice): training steps per second in fp32 and
   under bf16 autocast (timed interleaved), and the peak memory one step adds
   (``torch.cuda.max_memory_allocated`` above what was allocated before it).
5. ``nccl`` (2 GPUs or more): two processes in an NCCL process group, each embedding its half of a batch
   with a shared linear encoder, gathering the pool with
   :func:`~composer_dynsample.distributed.all_gather_embeddings` (``with_grad=True``), mining
   ``batch_hard`` against it and taking a cross-rank :class:`~composer_dynsample.InfoNCELoss` step
   (``global_mean=True``): the averaged gradient must equal one process's on the concatenated batch
   with the same tuples; the median step time is recorded.
6. ``corpus_search``: mined corpus negatives searched on the GPU (``_gpu_corpus.py``): every anchor of
   1,000,000 pairs exactly and with the own IVF, against the CPU's exact search of 2,000 anchors (equal
   lists, window recall), with the seconds of each.

Without CUDA every check is skipped with its reason, the results go to ``gpu_cpu_only.*`` (never over a
GPU machine's ``gpu.*``) and the exit status is 0. On CUDA the exit status is 1 when a check failed.

    python benchmarks/gpu.py [--quick] [--out benchmarks/results] [--checks miners,training,...]
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from _common import machine_info, markdown_table, time_interleaved, write_results
from _common import parser as make_parser
from _cuda import one_line, synchronize
from _gpu_corpus import check_corpus_search
from _gpu_miners import check_miners, miners_tables
from _gpu_ranks import check_nccl

ROOT = Path(__file__).resolve().parent.parent
CHECKS = ("miners", "training", "pin_memory", "transformer", "nccl", "corpus_search")
NO_CUDA = "CUDA is not available (torch.cuda.is_available() is False)"
WHY_CUDA = {
    "miners": "no CUDA miners to compare with the CPU ones",
    "training": "trainer.device=gpu and the amp_fp16 / amp_bf16 precisions need a CUDA device",
    "pin_memory": "pinned memory only speeds up copies to a CUDA device",
    "transformer": "the fp32 vs bf16 autocast step rate and peak memory are measured on a CUDA device",
    "nccl": "NCCL needs 2 CUDA devices",
    "corpus_search": "the corpus search of mined negatives is timed on a CUDA device",
}
PRECISIONS = ("fp32", "amp_fp16", "amp_bf16")


def skip_reasons(cuda_available: bool, device_count: int, nccl_available: bool) -> dict[str, str | None]:
    """Why each check cannot run on this machine (``None`` where it runs).

    Example:
        >>> skip_reasons(True, 1, True)["nccl"]
        'NCCL needs 2 CUDA devices, found 1 (torch.cuda.device_count())'
    """
    if not cuda_available:
        return {name: f"{NO_CUDA}: {WHY_CUDA[name]}" for name in CHECKS}
    reasons: dict[str, str | None] = dict.fromkeys(CHECKS)
    if device_count < 2:
        reasons["nccl"] = f"NCCL needs 2 CUDA devices, found {device_count} (torch.cuda.device_count())"
    elif not nccl_available:
        reasons["nccl"] = (
            "this torch has no NCCL for its CUDA devices (torch.distributed.is_nccl_available())"
        )
    return reasons


def cuda_info() -> dict[str, Any]:
    """The CUDA devices and the settings that change float32 results (TF32)."""
    info: dict[str, Any] = {"available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda}
    if info["available"]:
        info["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        info["matmul_allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
        info["cudnn_allow_tf32"] = torch.backends.cudnn.allow_tf32
        info["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    return info


# --- 2. training through the CLI ---------------------------------------------------------------------


def training_command(precision: str, device: str, run_dir: Path, epochs: int) -> list[str]:
    """The CLI call that trains the digits_quick recipe at ``precision`` on ``device`` for ``epochs``."""
    return [
        sys.executable, "-m", "composer_dynsample", "train", "yamls/digits_quick.yaml",
        f"trainer.precision={precision}", f"trainer.device={device}", f"trainer.max_duration={epochs}ep",
        f"evaluation.interval={epochs}ep", f"trainer.save_interval={epochs}ep",
        "--run-dir", str(run_dir), "--quiet",
    ]  # fmt: skip


def training_row(precision: str, device: str, run_dir: Path, epochs: int, timeout_s: float) -> dict:
    """Train once; the exit code, the final metrics and the seconds per epoch, or the error's last line."""
    row: dict[str, Any] = {"precision": precision}
    start = time.perf_counter()
    try:
        done = subprocess.run(
            training_command(precision, device, run_dir, epochs),
            cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {**row, "exit_code": None, "error": f"timed out after {timeout_s:.0f} s"}
    row.update(exit_code=done.returncode, launch_s=time.perf_counter() - start)
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
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


def check_training(device: str, epochs: int, precisions: Sequence[str] = PRECISIONS) -> dict:
    """One CLI training run per precision, each in its own temporary run directory."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as folder:
        rows = [training_row(p, device, Path(folder) / p, epochs, timeout_s=300) for p in precisions]
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
    device: torch.device, layers: int, hidden: int, batch: int, length: int, steps: int, rounds: int
) -> dict:
    """Steps per second in fp32 and under bf16 autocast (timed interleaved), and each step's peak memory."""
    try:
        from composer_dynsample.models.text import TransformerEncoder, import_text_extra  # noqa: F401

        import_text_extra("transformers", "the transformer check")
    except ImportError as error:
        return {"status": "skipped", "reason": one_line(error)}
    modes = {"fp32": None, "bf16 autocast": torch.bfloat16}
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
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


# --- the run -----------------------------------------------------------------------------------------


def check_runners(quick: bool, device: torch.device | None = None) -> dict[str, Callable[[], dict]]:
    """Each check at the size ``--quick`` asks for, on ``device`` (default: CUDA device 0)."""
    device = device or torch.device("cuda", 0)
    trainer_device = "gpu" if device.type == "cuda" else device.type
    if quick:
        return {
            "miners": lambda: check_miners(device, (256,), 256, budget_s=0.2),
            "training": lambda: check_training(trainer_device, epochs=1),
            "pin_memory": lambda: check_pin_memory(device, rows=1024, image=32, batch=256, rounds=2),
            "transformer": lambda: check_transformer(device, 2, 128, batch=32, length=32, steps=2, rounds=2),
            "nccl": lambda: check_nccl(batch=128, steps=3),
            "corpus_search": lambda: check_corpus_search(device, pairs=20_000, anchors=500),
        }
    return {
        "miners": lambda: check_miners(device, (1024, 4096), 1024, budget_s=2.0),
        "training": lambda: check_training(trainer_device, epochs=6),
        "pin_memory": lambda: check_pin_memory(device, rows=16384, image=64, batch=512, rounds=5),
        "transformer": lambda: check_transformer(device, 4, 256, batch=128, length=128, steps=10, rounds=5),
        "nccl": lambda: check_nccl(batch=1024, steps=20),
        "corpus_search": lambda: check_corpus_search(device, pairs=1_000_000),
    }


def run_check(run: Callable[[], dict]) -> dict:
    """Run one check; an exception becomes its ``error`` status (with the traceback), never the run's end."""
    start = time.perf_counter()
    try:
        result = run()
    except Exception as error:  # one check's failure must not stop the others
        result = {"status": "error", "reason": one_line(error), "traceback": traceback.format_exc()[-4000:]}
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    result["seconds"] = round(time.perf_counter() - start, 1)
    return result


def summary_table(results: dict[str, dict]) -> str:
    """One row per check: its status and what it found, or why it did not run."""
    rows = [
        [name, result["status"], result.get("summary") or result.get("reason", ""), result.get("seconds", "")]
        for name, result in results.items()
    ]
    return markdown_table(["check", "status", "result, or why not run", "seconds"], "lllr", rows)


def detail_tables(results: dict[str, dict]) -> list[str]:
    """The rows behind the summaries, one markdown table (or two) per check that ran."""
    tables = []
    for name, result in results.items():
        if result["status"] in ("skipped", "error"):
            continue
        if name == "miners":
            tables += miners_tables(result)
            continue
        rows = result.get("rows") or result.get("ranks") or []
        header = list(dict.fromkeys(key for row in rows for key in row))  # rows that failed have fewer
        cells = [[_cell(row.get(key, "")) for key in header] for row in rows]
        if rows:
            tables.append(f"{name}:\n\n" + markdown_table(header, "l" * len(header), cells))
    return tables


def _cell(value: object) -> object:
    return f"{value:.4g}" if isinstance(value, float) else value


def parse_checks(text: str | None) -> list[str]:
    """``--checks`` as a list of check names, in the order run; a ValueError names an unknown one."""
    if not text:
        return list(CHECKS)
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in CHECKS]
    if unknown:
        raise ValueError(f"--checks: unknown check {unknown[0]!r}; valid: {', '.join(CHECKS)}.")
    return [name for name in CHECKS if name in names]


def run_checks(
    checks: Sequence[str], reasons: dict[str, str | None], runners: dict[str, Callable[[], dict]]
) -> dict[str, dict]:
    """Run each check that has no reason to be skipped, one after the other, reporting progress."""
    results = {}
    for name in checks:
        results[name] = (
            {"status": "skipped", "reason": reasons[name]} if reasons[name] else run_check(runners[name])
        )
        print(f"{name}: {results[name]['status']}", file=sys.stderr, flush=True)
    return results


def report(results: dict[str, dict], out: Path, quick: bool, on_cuda: bool) -> str:
    """Write ``gpu.*`` (``gpu_cpu_only.*`` without CUDA, never over a GPU's results); return the table."""
    table = summary_table(results)
    result = {"quick": quick, "cuda": cuda_info(), "machine": machine_info(), "checks": results}
    notes = [f"Machine: {result['machine']}; CUDA: {json.dumps(result['cuda'])}", *detail_tables(results)]
    write_results(out, "gpu" if on_cuda else "gpu_cpu_only", quick, result, table, notes=notes)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, quick_help="small sizes, one epoch, few rounds: a smoke test")
    parser.add_argument("--checks", help=f"comma-separated subset of {','.join(CHECKS)} (default: all)")
    args = parser.parse_args(argv)
    try:
        checks = parse_checks(args.checks)
    except ValueError as error:
        parser.error(str(error))
    cuda = torch.cuda.is_available()
    nccl = torch.distributed.is_available() and torch.distributed.is_nccl_available()
    reasons = skip_reasons(cuda, torch.cuda.device_count() if cuda else 0, nccl)
    results = run_checks(checks, reasons, check_runners(args.quick))
    print(report(results, args.out, args.quick, cuda))
    return 1 if any(r["status"] in ("failed", "error") for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
