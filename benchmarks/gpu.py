"""What has a CUDA path in this package, run on a GPU: equal to the CPU, and how fast?

Six checks, each independent (one that fails, raises or runs out of time records it and the others
still run):

1. ``miners``: every miner of :mod:`composer_dynsample.mining` on the same clustered, L2-normalised
   float32 embeddings (D = 128, 16 per class) on the CPU and on CUDA, compared as sorted sets of tuples
   (``distance_weighted`` with the same seeded CPU generator on both; ``random_triplets``, whose CUDA
   generator is another algorithm than the CPU's, is checked for determinism, validity and the same
   anchors instead). A difference counts as a tie when the float64 distances show the two choices within
   1e-5 of each other or of the miner's threshold (``_mined_tuples.py``); anything else is a failure.
   fp16 and bf16 inputs are compared on CUDA with their own float32 copies (the package promises the
   same tuples except at ties). Times: median per call on the CPU and on CUDA (synchronised), timed
   interleaved, at B = 1024 and 4096.
2. ``training``: the CLI's ``train yamls/digits_quick.yaml trainer.device=gpu trainer.precision=P`` for P
   in fp32, amp_fp16, amp_bf16 (the ``trainer`` keys are Composer ``Trainer`` arguments), 3 epochs each,
   one after the other in one process (``_gpu_training.py``), each in a temporary run directory: exit
   code, final Recall@1 and MAP@R, and seconds per epoch (``wall_time_s`` of ``metrics.json``,
   ``Trainer.fit`` alone, over the epochs).
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
6. ``corpus_search``: mined corpus negatives on the GPU (``_gpu_corpus.py``) at 1,000,000 pairs: 256
   anchors searched exactly on the CPU and on CUDA (equal lists), every anchor with the own IVF on CUDA
   (window recall on the sample), with the seconds of each.

Time: the whole run takes at most 300 s (``--quick``: 90 s), every process included. Each check has a
share of it (:data:`PLANS`, with the reason for each size); the checks run one after the other in a
worker process (``_gpu_budget.py``), and one still running at the end of its share is killed with every
process it started, recorded as ``timed_out``, and the rest go on in a fresh worker. ``--budget S``
scales every share to a total of S seconds. Each check prints ``NAME: STATUS in S s`` to stderr as it
ends; the summary table has each check's seconds and share.

Without CUDA every check is skipped with its reason, the results go to ``gpu_cpu_only.*`` (never over a
GPU machine's ``gpu.*``) and the exit status is 0. On CUDA the exit status is 1 when a check failed, raised
or timed out. ``--device cpu`` is the dry run of this script on any machine: the checks that mean
something there (miners CPU against CPU, training in fp32, the transformer in fp32, the corpus search)
at tiny sizes, written to ``gpu_on_cpu_quick.*`` (ignored by git).

    python benchmarks/gpu.py [--quick] [--device cuda|cpu] [--budget SECONDS] [--checks miners,...]
        [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from _common import markdown_table, write_results
from _common import parser as make_parser
from _gpu_budget import Budget, Run, emitter, run_with_deadlines

if TYPE_CHECKING:
    import torch

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
# With --device cpu, the checks that mean nothing on the CPU.
WHY_NOT_ON_CPU = {
    "pin_memory": "--device cpu: pinned memory only speeds up copies to a CUDA device",
    "nccl": "--device cpu: NCCL needs 2 CUDA devices (tests/benchmarks/test_gpu.py runs this step over gloo)",
}
# Each check's function, imported by the worker only when the check runs: Composer, transformers and
# the corpus search cost seconds of imports each on the GPU machine. Each takes the device, then its sizes.
FUNCTIONS = {
    "miners": ("_gpu_miners", "check_miners"),
    "training": ("_gpu_training", "check_training"),
    "pin_memory": ("_gpu_training", "check_pin_memory"),
    "transformer": ("_gpu_training", "check_transformer"),
    "nccl": ("_gpu_ranks", "check_nccl"),
    "corpus_search": ("_gpu_corpus", "check_corpus_search"),
}


class Plan(NamedTuple):
    """A check's share of the run in seconds (past it, it is stopped: ``timed_out``) and its sizes (the
    keywords of its function)."""

    share_s: float
    sizes: dict[str, Any]


# The whole run's seconds, and a worker's start-up (``import torch`` and the CUDA context; the GPU
# machine's README measured 17.9 s for torch with Composer and the CLI, cold) in each mode.
TOTAL_S = {"full": 300.0, "quick": 90.0, "cpu": 150.0}
START_S = {"full": 30.0, "quick": 20.0, "cpu": 20.0}
PLANS: dict[str, dict[str, Plan]] = {
    # One H100 or H200 with 16 cores. The first H200 run (the GPU machine's README) finished miners
    # and transformer at these sizes (miners at 2 s of timing each) and neither training (3 processes of
    # 18 s of imports each, 6 epochs) nor corpus_search (every anchor of 1M searched exactly) in ~100 s.
    "full": {
        # 12 timings (6 miners x 2 sizes) of ~1 s each (was 2 s), interleaved CPU / CUDA, and 24 tuple
        # comparisons (float64 tie checks only where lists differ): ~20 s, estimated.
        "miners": Plan(40, {"batches": (1024, 4096), "dtype_batch": 1024, "budget_s": 1.0}),
        # The three precisions in the worker: Composer's import (most of the 18 s) paid once; 3 epochs of
        # 22 steps so s/epoch averages past the warm-up epoch, evaluated once. ~12 s of imports, then a
        # few seconds a run (estimated; a 1-epoch run after the first takes 0.7 s on a 2-core CPU).
        "training": Plan(60, {"epochs": 3, "precisions": ("fp32", "amp_fp16", "amp_bf16")}),
        # 256 MiB an epoch (32 batches) through 4 loaders, 6 epochs each: ~6 GiB of gathers and copies
        # at host-memory speed, a few seconds.
        "pin_memory": Plan(25, {"rows": 16384, "image": 64, "batch": 512, "rounds": 5}),
        # ~130 steps of a 4-layer BERT at B = 128 x 128 tokens (milliseconds each in bf16) after
        # transformers' import: finished in the first H200 run.
        "transformer": Plan(
            35, {"layers": 4, "hidden": 256, "batch": 128, "length": 128, "steps": 10, "rounds": 5}
        ),
        # 2 ranks importing torch and the package (~10-20 s there), NCCL's set-up, 21 steps of a linear
        # layer; the launcher's own timeout comes first, so the error names the rank that hung.
        "nccl": Plan(45, {"batch": 1024, "steps": 20, "timeout_s": 40}),
        # 1M pairs (the mined-negatives goal size); the IVF on CUDA over every anchor is the sampler's
        # refresh at that size (27 s on a 2-core CPU, corpus_negatives.py). The exact lists are checked
        # on 256 anchors: on a 2-core CPU their exact search takes 3 s over 10 s of fixed cost per
        # search at this size (torch.isfinite over 2M rows), a fraction of that on 16 cores; 2,000
        # would take ~23 s there. Generating the 2M rows takes 7 s there.
        "corpus_search": Plan(60, {"pairs": 1_000_000, "anchors": 256}),
    },
    # A smoke test of every code path in <= 90 s: one size each, one epoch, few rounds.
    "quick": {
        "miners": Plan(6, {"batches": (256,), "dtype_batch": 256, "budget_s": 0.2}),
        # Composer's import (~12 s cold, estimated from the 18 s) and 3 one-epoch runs.
        "training": Plan(26, {"epochs": 1, "precisions": ("fp32", "amp_fp16", "amp_bf16")}),
        "pin_memory": Plan(5, {"rows": 1024, "image": 32, "batch": 256, "rounds": 2}),
        # transformers' import, then 12 steps of a 2-layer BERT.
        "transformer": Plan(
            11, {"layers": 2, "hidden": 128, "batch": 32, "length": 32, "steps": 2, "rounds": 2}
        ),
        # Mostly the 2 ranks' imports, from a warm page cache by then (2 GPUs or more only).
        "nccl": Plan(12, {"batch": 128, "steps": 3, "timeout_s": 11}),
        # Composer is imported by training before it; at 20,000 pairs the IVF's k-means and scan take
        # 4 s on a 2-core CPU, the exact searches of 256 anchors 0.2 s.
        "corpus_search": Plan(10, {"pairs": 20_000, "anchors": 256}),
    },
    # --device cpu: this script's dry run on a CPU, float32 only, at tiny sizes (CUDA-only checks
    # skipped). The whole run took 14 to 21 s on a shared 2-core machine; the shares leave room for its load.
    "cpu": {
        "miners": Plan(15, {"batches": (128,), "dtype_batch": 128, "budget_s": 0.05}),
        # Composer's import (7 s on 2 cores) and one epoch (0.3 s).
        "training": Plan(45, {"epochs": 1, "precisions": ("fp32",)}),
        "pin_memory": Plan(5, {"rows": 256, "image": 8, "batch": 64, "rounds": 1}),
        "transformer": Plan(
            20,
            {
                "layers": 1,
                "hidden": 32,
                "batch": 4,
                "length": 8,
                "steps": 1,
                "rounds": 1,
                "precisions": ("fp32",),
            },
        ),
        "nccl": Plan(15, {"batch": 16, "steps": 1, "timeout_s": 14}),
        # The CPU stands in for the GPU: the same exact search on both sides, the IVF against it.
        "corpus_search": Plan(20, {"pairs": 3_000, "anchors": 256}),
    },
}


def run_mode(device: str, quick: bool) -> str:
    """Which plan runs: ``cpu`` for ``--device cpu`` (``--quick`` or not), else ``quick`` or ``full``.

    Example:
        >>> run_mode("cuda", True), run_mode("cpu", False)
        ('quick', 'cpu')
    """
    return "cpu" if device == "cpu" else ("quick" if quick else "full")


def budget_for(mode: str, total_s: float | None = None) -> Budget:
    """The mode's start-up and shares, scaled so that the whole run takes ``total_s`` (default: the mode's).

    Example:
        >>> budget_for("full", 600).shares_s["training"]
        120.0
    """
    budget = Budget(START_S[mode], {name: plan.share_s for name, plan in PLANS[mode].items()}, TOTAL_S[mode])
    return budget if total_s is None else budget.scaled(total_s / TOTAL_S[mode])


def skip_reasons(
    device: str, cuda_available: bool, device_count: int, nccl_available: bool
) -> dict[str, str | None]:
    """Why each check cannot run on ``device`` (``cuda`` or ``cpu``) of this machine (``None`` where it runs).

    Example:
        >>> skip_reasons("cuda", True, 1, True)["nccl"]
        'NCCL needs 2 CUDA devices, found 1 (torch.cuda.device_count())'
    """
    if device == "cpu":
        return {name: WHY_NOT_ON_CPU.get(name) for name in CHECKS}
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
    import torch

    info: dict[str, Any] = {"available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda}
    if info["available"]:
        info["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        info["matmul_allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
        info["cudnn_allow_tf32"] = torch.backends.cudnn.allow_tf32
        info["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    return info


# --- the worker: the checks in this process --------------------------------------------------------


def work(names: Sequence[str], events: Path, mode: str, device_name: str) -> int:
    """Run ``names`` here, one after the other, reporting to ``events`` (``_gpu_budget.py``'s protocol).

    Stops after a check that ends in ``error``: a CUDA error can leave this process's context unusable,
    so a fresh worker runs the rest.
    """
    import torch
    from _common import machine_info

    emit = emitter(events)
    cuda = torch.cuda.is_available()
    nccl = cuda and torch.distributed.is_available() and torch.distributed.is_nccl_available()
    reasons = skip_reasons(device_name, cuda, torch.cuda.device_count() if cuda else 0, nccl)
    device = torch.device("cuda", 0) if device_name == "cuda" else torch.device("cpu")
    emit("ready", cuda=cuda_info(), machine=machine_info())
    for name in names:
        if reasons[name]:
            emit("done", check=name, result={"status": "skipped", "reason": reasons[name]})
            continue
        emit("start", check=name)
        result = run_check(name, device, PLANS[mode][name].sizes)
        emit("done", check=name, result=result)
        if result["status"] == "error":
            break
    return 0


def run_check(name: str, device: torch.device, sizes: dict[str, Any]) -> dict:
    """Run one check; an exception becomes its ``error`` status (with the traceback), never the run's end.

    The result's ``tables`` are its markdown tables, made here where the check's module is loaded.
    """
    import torch
    from _cuda import one_line

    start = time.perf_counter()
    try:
        with _restored_torch_settings():
            module, function = FUNCTIONS[name]
            result = getattr(importlib.import_module(module), function)(device, **sizes)
        result["tables"] = detail_tables(name, result)
    except Exception as error:  # one check's failure must not stop the others
        result = {"status": "error", "reason": one_line(error), "traceback": traceback.format_exc()[-4000:]}
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    result["seconds"] = round(time.perf_counter() - start, 1)
    return result


@contextlib.contextmanager
def _restored_torch_settings() -> Iterator[None]:
    """Put back the global settings a check may change for the checks after it in this worker: Composer's
    GPU device turns TF32 matmuls on, its reproducibility helper deterministic algorithms."""
    import torch

    backends = torch.backends
    saved = (
        torch.get_float32_matmul_precision(),
        backends.cuda.matmul.allow_tf32,
        backends.cudnn.allow_tf32,
        backends.cudnn.benchmark,
        backends.cudnn.deterministic,
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved[0])
        backends.cuda.matmul.allow_tf32, backends.cudnn.allow_tf32 = saved[1], saved[2]
        backends.cudnn.benchmark, backends.cudnn.deterministic = saved[3], saved[4]
        torch.use_deterministic_algorithms(saved[5], warn_only=saved[6])


def detail_tables(name: str, result: dict) -> list[str]:
    """The rows behind a check's summary, as one markdown table (two for the miners)."""
    if name == "miners":
        from _gpu_miners import miners_tables

        return miners_tables(result)
    rows = result.get("rows") or result.get("ranks") or []
    header = list(dict.fromkeys(key for row in rows for key in row))  # rows that failed have fewer
    cells = [[_cell(row.get(key, "")) for key in header] for row in rows]
    return [f"{name}:\n\n" + markdown_table(header, "l" * len(header), cells)] if rows else []


def _cell(value: object) -> object:
    return f"{value:.4g}" if isinstance(value, float) else value


# --- the run ---------------------------------------------------------------------------------------


def summary_table(results: dict[str, dict], shares_s: dict[str, float]) -> str:
    """One row per check: its status, what it found or why it did not run, its seconds and its share."""
    rows = [
        [name, result["status"], result.get("summary") or result.get("reason", ""), result.get("seconds", ""),
         f"{round(shares_s[name], 1):g}"]
        for name, result in results.items()
    ]  # fmt: skip
    return markdown_table(
        ["check", "status", "result, or why not run", "seconds", "share (s)"], "lllrr", rows
    )


def parse_checks(text: str | None) -> list[str]:
    """``--checks`` as a list of check names, in the order run; a ValueError names an unknown one."""
    if not text:
        return list(CHECKS)
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in CHECKS]
    if unknown:
        raise ValueError(f"--checks: unknown check {unknown[0]!r}; valid: {', '.join(CHECKS)}.")
    return [name for name in CHECKS if name in names]


def results_name(device: str, cuda_available: bool) -> str:
    """``gpu`` on CUDA, ``gpu_cpu_only`` without it, ``gpu_on_cpu`` for the ``--device cpu`` dry run.

    Example:
        >>> results_name("cuda", False), results_name("cpu", True)
        ('gpu_cpu_only', 'gpu_on_cpu')
    """
    if device == "cpu":
        return "gpu_on_cpu"
    return "gpu" if cuda_available else "gpu_cpu_only"


def report(run: Run, out: Path, mode: str, device: str, budget: Budget, wall_s: float) -> str:
    """Write the results (``gpu.*``, ``gpu_cpu_only.*`` or ``gpu_on_cpu_quick.*``); return the summary."""
    tables = [table for result in run.results.values() for table in result.pop("tables", [])]
    table = summary_table(run.results, dict(budget.shares_s))
    cuda = run.ready["cuda"]
    result = {
        "quick": mode == "quick", "mode": mode, "device": device, "cuda": cuda, "machine": run.ready["machine"],
        "budget": {"total_s": budget.total_s, "start_s": budget.start_s, "shares_s": dict(budget.shares_s)},
        "worker_starts_s": run.starts_s, "wall_s": round(wall_s, 1), "checks": run.results,
    }  # fmt: skip
    notes = [
        f"Machine: {result['machine']}; CUDA: {json.dumps(cuda)}",
        f"Wall time {wall_s:.1f} s of a {budget.total_s:.0f} s budget; worker start-ups: {run.starts_s} s.",
        *tables,
    ]
    # The dry run on a CPU always writes *_quick.*, which git ignores: never over a GPU machine's results.
    name = results_name(device, bool(cuda.get("available")))
    write_results(out, name, mode != "full", result, table, notes=notes)
    return table


def worker_command(names: list[str], events: Path, device: str, quick: bool) -> list[str]:
    """The command line of a worker running ``names`` and reporting to ``events``."""
    command = [sys.executable, str(Path(__file__).resolve()), "--events-to", str(events)]
    return [*command, "--checks", ",".join(names), "--device", device, *(["--quick"] if quick else [])]


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    parser = make_parser(__doc__, quick_help="small sizes, one epoch, few rounds: a smoke test in <= 90 s")
    parser.add_argument("--checks", help=f"comma-separated subset of {','.join(CHECKS)} (default: all)")
    parser.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda",
        help="cpu: a dry run of this script at tiny sizes, written to gpu_on_cpu_quick.* (default: cuda)",
    )  # fmt: skip
    parser.add_argument(
        "--budget", type=float, help="the whole run's seconds; every share scales with it "
        f"(default: {TOTAL_S['full']:.0f}, --quick {TOTAL_S['quick']:.0f}, --device cpu {TOTAL_S['cpu']:.0f})",
    )  # fmt: skip
    parser.add_argument("--events-to", type=Path, help=argparse.SUPPRESS)  # a worker (_gpu_budget.py)
    args = parser.parse_args(argv)
    try:
        checks = parse_checks(args.checks)
        mode = run_mode(args.device, args.quick)
        budget = budget_for(mode, args.budget)
    except ValueError as error:
        parser.error(str(error))
    if args.events_to is not None:
        return work(checks, args.events_to, mode, args.device)
    run = run_with_deadlines(
        checks, budget, lambda names, events: worker_command(names, events, args.device, args.quick)
    )
    wall_s = time.monotonic() - started
    print(f"gpu.py: {len(checks)} checks in {wall_s:.1f} s (budget {budget.total_s:.0f} s)", file=sys.stderr)
    if not run.ready:
        print(summary_table(run.results, dict(budget.shares_s)))
        print("gpu.py: no worker process started, so nothing was written.", file=sys.stderr)
        return 1
    print(report(run, args.out, mode, args.device, budget, wall_s))
    bad = ("failed", "error", "timed_out")
    return 1 if any(result["status"] in bad for result in run.results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
