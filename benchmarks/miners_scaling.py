"""How every miner scales with the batch size and with the size of the reference pool (memory bank).

Two sweeps over the miners of :mod:`composer_dynsample.mining` (batch_hard, semi_hard, hard_topk(k=3),
distance_weighted, multi_similarity), all with their default distance and L2-normalised random
embeddings (D = 128, 8 samples per class):

* batch size B = 64, 128, ..., 4096, mining the batch against itself;
* reference pool of 1k, 4k, 16k and 64k rows at B = 256 (``ref_embeddings`` / ``ref_labels``, as with
  the cross-batch memory), pool labels drawn from the same classes.

Time: every miner and one ``emb @ ref.T`` matmul of the same size (the floor: the distance matrix every
miner has to compute) are timed in the same process with ``torch.set_num_threads`` fixed, interleaved
round by round so that load from other processes hits all of them alike; the median over the rounds
after a warm-up call is reported. The number of rounds shrinks with the cost of a round (at least 3).

Peak memory: torch's CPU allocator keeps no statistics (``torch.cuda.max_memory_allocated`` exists for
CUDA only) and ``tracemalloc`` does not see its allocations, so the peak is read from the kernel: each
(miner, size) runs in a fresh process (forked from a server subprocess that has imported torch and the
miners but allocated nothing large, so that the torch import is paid once) which builds its inputs, makes one tiny warm-up call (code
paths, library buffers), resets the peak resident set size (``VmHWM``) to the current RSS by writing
``5`` to ``/proc/self/clear_refs``, makes one call and reports ``VmHWM - VmRSS(before)``: every page
the call touched (distance chunks, masks, sort buffers, the output). A fresh process keeps memory freed
by earlier calls from being reused unseen. Without ``/proc`` the ``ru_maxrss`` growth is used (a lower
bound). The matmul's growth is about the size of its output.

    python benchmarks/miners_scaling.py [--quick] [--out benchmarks/results] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from _common import (
    label_axes,
    load_average,
    machine_info,
    markdown_table,
    peak_growth_bytes,
    rounds_for_budget,
    save_figure,
    time_interleaved,
    write_results,
)
from _common import parser as make_parser

from composer_dynsample.mining import MINERS as MINER_CLASSES

DIM = 128
PER_CLASS = 8
MINERS = ("batch_hard", "semi_hard", "hard_topk", "distance_weighted", "multi_similarity")
FULL_BATCHES = (64, 128, 256, 512, 1024, 2048, 4096)
QUICK_BATCHES = (64, 128, 256)
FULL_POOLS = (1024, 4096, 16384, 65536)
QUICK_POOLS = (1024, 4096)
POOL_BATCH = 256
NAMES = ("matmul", *MINERS)


def make_inputs(batch: int, pool: int = 0, seed: int = 0) -> dict[str, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(seed)
    emb = F.normalize(torch.randn(batch, DIM, generator=gen), dim=1)
    classes = max(1, batch // PER_CLASS)
    labels = torch.arange(classes).repeat_interleave(PER_CLASS)[:batch]
    if pool:
        ref = F.normalize(torch.randn(pool, DIM, generator=gen), dim=1)
        ref_labels = torch.randint(0, classes, (pool,), generator=gen)
    else:
        ref, ref_labels = None, None
    return {"emb": emb, "labels": labels, "ref": ref, "ref_labels": ref_labels}


def call_of(name: str, inputs: dict[str, torch.Tensor | None]) -> Callable[[], object]:
    emb, labels, ref, ref_labels = inputs["emb"], inputs["labels"], inputs["ref"], inputs["ref_labels"]
    if name == "matmul":
        other = emb if ref is None else ref
        return lambda: emb @ other.T
    miner_class = MINER_CLASSES[name]
    options: dict[str, object] = {"k": 3} if name == "hard_topk" else {}
    if name == "distance_weighted":
        gen = torch.Generator()
        return lambda: miner_class(generator=gen.manual_seed(0))(emb, labels, ref, ref_labels)
    return lambda: miner_class(**options)(emb, labels, ref, ref_labels)


def _measure_one(name: str, batch: int, pool: int) -> int:
    """Peak-RSS growth (bytes) of one call, in a process that has done no large allocation yet."""
    call_of(name, make_inputs(16, 64 if pool else 0, seed=1))()  # warm-up at a tiny size
    fn = call_of(name, make_inputs(batch, pool))
    return peak_growth_bytes(fn)


def memory_server(jobs: list[tuple[str, int, int]], threads: int) -> None:
    """Runs in a fresh subprocess that imports torch and the miners but computes nothing itself.

    Each job runs in a child forked from it: a fresh address space with no freed heap memory to reuse
    unseen, without paying the torch import per job. The server never runs a torch op before forking
    (an OpenMP thread pool must not be inherited across ``fork``). Prints one JSON list of bytes.
    """
    results = []
    for name, batch, pool in jobs:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            os.close(read)
            code = 0
            try:
                torch.set_num_threads(threads)
                os.write(write, str(_measure_one(name, batch, pool)).encode())
            except BaseException:  # reported through the exit status and the traceback
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                os.close(write)
                os._exit(code)
        os.close(write)
        with os.fdopen(read) as f:
            value = f.read()
        _, status = os.waitpid(pid, 0)
        if status != 0 or not value:
            raise RuntimeError(f"memory job {(name, batch, pool)} failed (wait status {status})")
        results.append(int(value))
    print(json.dumps(results))


def peak_memory(jobs: list[tuple[str, int, int]], threads: int) -> dict:
    """Peak-RSS growth in MiB per (miner, batch, pool), each in its own freshly forked process."""
    if not hasattr(os, "fork"):
        raise RuntimeError("the memory measurement needs os.fork (Linux / macOS)")
    out = subprocess.run(
        [sys.executable, __file__, "--memory-server", json.dumps(jobs), "--threads", str(threads)],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"memory server failed ({out.returncode}): {out.stderr[-2000:]}")
    values = json.loads(out.stdout.strip().splitlines()[-1])
    return {job: value / 2**20 for job, value in zip(jobs, values)}


def plot(rows: list[dict], path: Path, quick: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    panels = [
        ("batch", "time_ms", "batch size B (no pool)", "median time per call (ms)", "time vs batch size"),
        ("pool", "time_ms", f"reference pool rows (B = {POOL_BATCH})", "median time per call (ms)",
         "time vs pool size"),
        ("pool", "peak_mib", f"reference pool rows (B = {POOL_BATCH})", "peak RSS growth of one call (MiB)",
         "peak memory vs pool size"),
    ]  # fmt: skip
    for ax, (sweep, key, xlabel, ylabel, title) in zip(axes, panels):
        for name in (*MINERS, "matmul"):
            pts = [r for r in rows if r["sweep"] == sweep and r["miner"] == name and r[key] is not None]
            xs = [r["batch"] if sweep == "batch" else r["pool"] for r in pts]
            ys = [max(r[key], 1e-3) for r in pts]
            style = {"color": "black", "linestyle": "--"} if name == "matmul" else {}
            label = "emb @ ref.T (floor)" if name == "matmul" else name
            ax.plot(xs, ys, marker="o", label=label, **style)
        ax.set_xscale("log", base=2)
        label_axes(ax, xlabel, ylabel, title)
    axes[0].legend(fontsize=8)
    fig.suptitle(
        f"miner scaling, D = {DIM}, {PER_CLASS} per class, {torch.get_num_threads()} threads"
        + (" (quick)" if quick else "")
    )
    save_figure(fig, path)


Setting = tuple[str, int, int]  # (sweep, batch, pool)


def time_settings(settings: list[Setting], budget: float, max_rounds: int) -> dict[Setting, dict]:
    """Per setting: the rounds that fit the budget and each call's median seconds, interleaved."""
    timings = {}
    for sweep, batch, pool in settings:
        inputs = make_inputs(batch, pool)
        fns = {n: call_of(n, inputs) for n in NAMES}
        rounds = rounds_for_budget(fns, budget, max_rounds)
        timings[(sweep, batch, pool)] = {"rounds": rounds, **time_interleaved(fns, rounds, warmup=0)}
    return timings


def scaling_rows(settings: list[Setting], timings: dict[Setting, dict], peaks: dict) -> list[dict]:
    """One row per (setting, miner): time, ratio to the matmul, peak memory and the B x pool size."""
    rows = []
    for sweep, batch, pool in settings:
        t = timings[(sweep, batch, pool)]
        for name in NAMES:
            peak = peaks.get((name, batch, pool))
            rows.append(
                {
                    "sweep": sweep,
                    "miner": name,
                    "batch": batch,
                    "pool": pool,
                    "rounds": t["rounds"],
                    "time_ms": round(t[name] * 1e3, 3),
                    "over_matmul": round(t[name] / t["matmul"], 2),
                    "peak_mib": None if peak is None else round(peak, 2),
                    "float32_matrix_mib": round(batch * (pool or batch) * 4 / 2**20, 2),
                }
            )
    return rows


def _cell(r: dict) -> str:
    cell = f"{r['time_ms']:.2f} ms"
    if r["miner"] != "matmul":
        cell += f" ({r['over_matmul']:.1f}x)"
    if r["peak_mib"] is not None:
        cell += f", {r['peak_mib']:.1f} MiB"
    return cell


def sweep_table(rows: list[dict], sweep: str) -> str:
    """Miners down, sizes across: time (x matmul) and peak MiB per cell."""
    keys = list(dict.fromkeys((r["sweep"], r["batch"], r["pool"]) for r in rows if r["sweep"] == sweep))
    col = "B" if sweep == "batch" else f"pool rows (B = {POOL_BATCH})"
    header = ["miner", *(f"{col} {s[1] if sweep == 'batch' else s[2]}" for s in keys)]
    by_key = {(r["sweep"], r["batch"], r["pool"], r["miner"]): r for r in rows}
    body = [
        [
            "matmul emb @ ref.T (floor)" if name == "matmul" else name,
            *(_cell(by_key[(*s, name)]) for s in keys),
        ]
        for name in NAMES
    ]
    return markdown_table(header, "l" + "r" * len(keys), body)


def summary(rows: list[dict], top: int, largest_pool: int) -> tuple[str, str, dict]:
    """The goal, the measured sentence and the worst miner / matmul row at the largest batch."""
    at_top = [r for r in rows if r["sweep"] == "batch" and r["batch"] == top and r["miner"] != "matmul"]
    worst = max(at_top, key=lambda r: r["over_matmul"])
    big_pool = [
        r for r in rows if r["sweep"] == "pool" and r["pool"] == largest_pool and r["miner"] != "matmul"
    ]
    worst_pool = max(big_pool, key=lambda r: r["over_matmul"])
    mem_pool = max(big_pool, key=lambda r: r["peak_mib"] or 0.0)
    goal = f"miner time within a small constant of one emb @ ref.T matmul as B grows (B = {top})"
    measured = (
        f"worst at B = {top}: {worst['miner']} {worst['time_ms']:.1f} ms = {worst['over_matmul']:.1f}x matmul; "
        f"pool {largest_pool}: worst {worst_pool['miner']} {worst_pool['over_matmul']:.1f}x matmul, "
        f"largest peak {mem_pool['miner']} {mem_pool['peak_mib']:.1f} MiB "
        f"(B x pool float32 = {mem_pool['float32_matrix_mib']:.1f} MiB)"
    )
    return goal, measured, worst


def tables(rows: list[dict]) -> str:
    """The two sweeps' tables of ``miners_scaling.md``."""
    return "\n\n".join(
        [
            "Median time per call (miner / matmul) and peak RSS growth of one call, by batch size (no pool):",
            sweep_table(rows, "batch"),
            f"By reference-pool size at B = {POOL_BATCH}:",
            sweep_table(rows, "pool"),
        ]
    )


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser(__doc__, quick_help=f"B up to {QUICK_BATCHES[-1]}, pool up to 4k", threads=2)
    parser.add_argument("--memory-server", metavar="JOBS_JSON", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_server:
        memory_server([(n, int(b), int(p)) for n, b, p in json.loads(args.memory_server)], args.threads)
        return {}

    torch.set_num_threads(args.threads)
    load_before = load_average()
    batches = QUICK_BATCHES if args.quick else FULL_BATCHES
    pools = QUICK_POOLS if args.quick else FULL_POOLS
    settings = [("batch", b, 0) for b in batches] + [("pool", POOL_BATCH, p) for p in pools]
    timings = time_settings(settings, *((0.5, 5) if args.quick else (4.0, 21)))
    # Memory: every setting, each (miner, size) in a freshly forked process.
    peaks = peak_memory([(n, b, p) for _, b, p in settings for n in NAMES], args.threads)
    rows = scaling_rows(settings, timings, peaks)
    text = tables(rows)
    goal, measured, worst = summary(rows, batches[-1], pools[-1])
    print(f"{text}\n\ngoal: {goal}\nmeasured: {measured}")
    config = {
        "threads": args.threads,
        "dim": DIM,
        "samples_per_class": PER_CLASS,
        "batches": list(batches),
        "pools": list(pools),
        "pool_batch": POOL_BATCH,
        "quick": args.quick,
        "torch": torch.__version__,
        "machine": machine_info(),
        "cpus": os.cpu_count(),
        "load_average_1_5_15min_before": load_before,
        "load_average_1_5_15min_after": load_average(),
        "memory_method": "VmHWM - VmRSS of a fresh subprocess around one call (VmHWM reset via clear_refs)",
    }
    result = {
        "ratio": worst["over_matmul"],
        "ratio_meaning": f"worst miner time / emb @ emb.T matmul time at the largest batch, B = {batches[-1]} "
        "(median per call, same process, interleaved)",
        "goal": goal,
        "measured": measured,
        "rows": rows,
        "config": config,
    }
    notes = [f"goal: {goal}", f"measured: {measured}"]
    plot_to = lambda path: plot(rows, path, args.quick)  # noqa: E731
    return write_results(args.out, "miners_scaling", args.quick, result, text, notes=notes, plot=plot_to)


if __name__ == "__main__":
    main()
