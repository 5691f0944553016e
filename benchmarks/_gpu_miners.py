"""Check 1 of ``gpu.py``: every miner on CUDA against the CPU, as sets of tuples, and their speed.

Embeddings: ``B`` clustered, L2-normalised float32 rows (D = 128, 16 per class, class centres plus 1.5x
their spread of noise), so that the miners find realistic positives, negatives and semi-hard bands.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from _common import markdown_table, rounds_for_budget, time_interleaved
from _cuda import one_line, synchronize
from _mined_tuples import compare_tuples, cosine_distances, unexplained_differences

# Miner arguments (the defaults, spelled out for the tie rules); random_triplets and distance_weighted
# take a seeded generator.
MINER_CALLS: dict[str, dict[str, Any]] = {
    "batch_hard": {},
    "semi_hard": {"margin": 0.2},
    "hard_topk": {"k": 5},
    "multi_similarity": {"epsilon": 0.1},
    "distance_weighted": {"cutoff": 0.5, "nonzero_loss_cutoff": 1.4},
    "random_triplets": {},
}
SEEDED = ("distance_weighted", "random_triplets")
EMBEDDING_DIM, PER_CLASS, SPREAD = 128, 16, 1.5


def clustered_embeddings(batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` L2-normalised float32 embeddings, ``PER_CLASS`` per class around random centres."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(batch) // PER_CLASS
    labels = labels[torch.randperm(batch, generator=generator)]
    centres = torch.randn(int(labels.max()) + 1, EMBEDDING_DIM, generator=generator)
    noise = torch.randn(batch, EMBEDDING_DIM, generator=generator)
    return torch.nn.functional.normalize(centres[labels] + SPREAD * noise, dim=1), labels


def run_miner(
    name: str, embeddings: torch.Tensor, labels: torch.Tensor, generator_device: str | None = None
) -> tuple[torch.Tensor, ...]:
    """One miner on the embeddings; ``generator_device`` seeds a generator (0) there for the sampling ones."""
    from composer_dynsample.mining import MINERS

    kwargs = dict(MINER_CALLS[name])
    if generator_device is not None and name in SEEDED:
        kwargs["generator"] = torch.Generator(device=generator_device).manual_seed(0)
    return MINERS[name](**kwargs)(embeddings, labels)


def tie_params(name: str) -> dict[str, Any]:
    """The miner's arguments and the embedding dimension, as the tie rules of ``_mined_tuples`` read them."""
    return {**MINER_CALLS[name], "dim": EMBEDDING_DIM}


def equality_row(name: str, reference: Any, got: Any, embeddings: torch.Tensor, labels: torch.Tensor) -> dict:
    """Tuples of each run, whether identical, how many differ and how many of those are not near-ties."""
    comparison = compare_tuples(reference, got, len(labels))
    unexplained = 0
    if not comparison.equal:
        distances = cosine_distances(embeddings)
        unexplained = unexplained_differences(
            name, comparison, reference, got, distances, labels, tie_params(name)
        )
    return {
        "tuples_cpu": comparison.counts[0],
        "tuples_device": comparison.counts[1],
        "identical": comparison.equal,
        "differing": comparison.differing,
        "unexplained": unexplained,
    }


def random_triplets_row(embeddings: torch.Tensor, labels: torch.Tensor, device: torch.device) -> dict:
    """random_triplets on the device: deterministic given a seeded device generator, valid, same anchors."""
    reference = run_miner("random_triplets", embeddings, labels, "cpu")
    emb, lab = embeddings.to(device), labels.to(device)
    first = run_miner("random_triplets", emb, lab, device.type)
    again = run_miner("random_triplets", emb, lab, device.type)
    a, p, n = (t.cpu() for t in first)
    valid = bool((labels[p] == labels[a]).all() & (p != a).all() & (labels[n] != labels[a]).all())
    deterministic = compare_tuples(first, again, len(labels)).equal
    same_anchors = torch.equal(a.sort().values, reference[0].sort().values)
    row = {"deterministic": deterministic, "valid": valid, "same_anchors": same_anchors}
    row.update(equality_row("random_triplets", reference, first, embeddings, labels))
    # The CPU and CUDA generators are different algorithms: equality with the CPU is not promised, a
    # reproducible, valid draw for the same anchors is.
    row["unexplained"] = 0 if deterministic and valid and same_anchors else max(row["differing"], 1)
    try:  # a CPU generator with device embeddings (distance_weighted accepts one)
        cpu_generated = run_miner("random_triplets", emb, lab, "cpu")
        row["cpu_generator_on_device"] = (
            "identical to the CPU" if compare_tuples(reference, cpu_generated, len(labels)).equal else "runs"
        )
    except Exception as error:  # recorded, not a failure of the check
        row["cpu_generator_on_device"] = one_line(error)
    return row


def miner_timing(
    name: str, embeddings: torch.Tensor, labels: torch.Tensor, device: torch.device, budget_s: float
) -> dict:
    """Median seconds per call on the CPU and on the device, timed interleaved."""
    emb, lab = embeddings.to(device), labels.to(device)

    def on_device() -> None:
        run_miner(name, emb, lab)
        synchronize(device)

    fns: dict[str, Callable[[], object]] = {
        "cpu": lambda: run_miner(name, embeddings, labels),
        "device": on_device,
    }
    times = time_interleaved(fns, rounds_for_budget(fns, budget_s, 25))
    return {
        "cpu_ms": times["cpu"] * 1e3,
        "device_ms": times["device"] * 1e3,
        "speedup": times["cpu"] / times["device"],
    }


def miner_row(name: str, batch: int, device: torch.device, budget_s: float) -> dict:
    """One miner at one batch size: its tuples on the CPU vs the device, and its time on each."""
    embeddings, labels = clustered_embeddings(batch)
    row: dict[str, Any] = {"miner": name, "batch": batch}
    if name == "random_triplets":
        row.update(random_triplets_row(embeddings, labels, device))
    else:
        reference = run_miner(name, embeddings, labels, "cpu")
        got = run_miner(name, embeddings.to(device), labels.to(device), "cpu")
        row.update(equality_row(name, reference, got, embeddings, labels))
    row.update(miner_timing(name, embeddings, labels, device, budget_s))
    return row


def dtype_row(name: str, batch: int, dtype: torch.dtype, device: torch.device) -> dict:
    """The miner on fp16 / bf16 embeddings vs on their float32 copies, both on the device."""
    embeddings, labels = clustered_embeddings(batch)
    half = embeddings.to(device=device, dtype=dtype)
    generator_device = device.type if name == "random_triplets" else "cpu"
    want = run_miner(name, half.float(), labels.to(device), generator_device)
    got = run_miner(name, half, labels.to(device), generator_device)
    row = {"miner": name, "batch": batch, "dtype": str(dtype).removeprefix("torch.")}
    row.update(equality_row(name, want, got, half, labels))
    return row


def check_miners(device: torch.device, batches: Sequence[int], dtype_batch: int, budget_s: float) -> dict:
    """Every miner at each batch size on the CPU and ``device``, and in fp16 / bf16 at ``dtype_batch``.

    ``budget_s`` bounds the interleaved timing of one miner at one size (both devices together).
    """
    rows = [miner_row(name, batch, device, budget_s) for batch in batches for name in MINER_CALLS]
    dtypes = [torch.float16, torch.bfloat16]
    dtype_rows = [dtype_row(name, dtype_batch, dtype, device) for dtype in dtypes for name in MINER_CALLS]
    bad = [
        f"{r['miner']} B={r['batch']} {r.get('dtype', 'float32')}"
        for r in rows + dtype_rows
        if r["unexplained"]
    ]
    ties = sum(1 for r in rows + dtype_rows if not r["identical"] and not r["unexplained"])
    speedups = [r["speedup"] for r in rows]
    summary = (
        f"{len(rows) + len(dtype_rows)} comparisons: {len(bad)} with differences that are not ties"
        f"{' (' + ', '.join(bad) + ')' if bad else ''}, {ties} equal except at near-ties; "
        f"device {min(speedups):.1f}x to {max(speedups):.1f}x the CPU's speed"
    )
    return {"status": "failed" if bad else "ok", "summary": summary, "rows": rows, "dtype_rows": dtype_rows}


def miners_tables(result: dict) -> list[str]:
    """The equality-and-speed table and the half-precision table of :func:`check_miners`' result."""
    header = [
        "miner",
        "B",
        "tuples CPU",
        "tuples CUDA",
        "identical",
        "differing",
        "not ties",
        "CPU ms",
        "CUDA ms",
        "speed-up",
    ]
    rows = [
        [r["miner"], r["batch"], r["tuples_cpu"], r["tuples_device"], r["identical"], r["differing"], r["unexplained"],
         f"{r['cpu_ms']:.2f}", f"{r['device_ms']:.2f}", f"{r['speedup']:.1f}x"]
        for r in result["rows"]
    ]  # fmt: skip
    dtype_rows = [
        [r["miner"], r["batch"], r["dtype"], r["identical"], r["differing"], r["unexplained"]]
        for r in result["dtype_rows"]
    ]
    return [
        "Miners, CPU vs CUDA (float32):\n\n" + markdown_table(header, "llrrlrrrrr", rows),
        "Miners on CUDA, half-precision input vs its float32 copy:\n\n"
        + markdown_table(["miner", "B", "dtype", "identical", "differing", "not ties"], "llllrr", dtype_rows),
    ]
