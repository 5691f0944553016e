"""Training throughput on 1 and 2 CPU ranks (gloo), and what the cross-rank all-gather costs.

1. Steps per second of ``composer-dynsample train`` launched the way users launch it,
   ``python -m composer.cli.launcher -n N --master_port PORT -m composer_dynsample train RECIPE ...``,
   on the MNIST-1D default recipe (``--quick``: the digits_quick recipe) with dotted overrides:
   ``trainer.max_duration=<n>ba evaluation.interval=null`` (no evaluation during training; the final one
   runs after ``fit`` and is not timed) ``trainer.save_folder=null`` (no checkpoints)
   ``trainer.progress_bar=false``, and hard-negative mining with ``cross_rank=false``, or
   ``cross_rank=true`` with ``gather=autograd`` or ``gather=constant``. Every rank draws its own P x K
   batch (the global batch is N times the per-rank batch).

   The step time is measured inside the run: ``callbacks.speed_monitor.window_size=1`` (Composer's
   SpeedMonitor, which logs after each batch the wall time since the previous batch ended) with
   ``loggers.file.filename=...`` (Composer's FileLogger); the median over the batches after the first
   ``WARMUP_STEPS`` on rank 0 is reported (with its quartiles in the JSON). A median over per-step
   times resists the load of other processes on a shared machine better than a total. The fit time
   (``wall_time_s`` of the run's ``metrics.json``, ``Trainer.fit`` alone) per batch is kept in the JSON
   as a cross-check. The process start-up (launcher, imports, data, model and Trainer construction,
   final evaluation, teardown) is the launch's wall clock minus the fit time, in its own column.
   ``--quick`` launches its two runs concurrently (a smoke test, not a measurement).

2. A micro-benchmark of :func:`composer_dynsample.distributed.all_gather_embeddings`: two processes in
   a gloo process group on 127.0.0.1 (started directly as subprocesses with ``RANK`` / ``WORLD_SIZE`` /
   ``MASTER_ADDR`` / ``MASTER_PORT``, one torch thread each), timing forward + backward of the gather of
   a ``(B, 64)`` batch for B = 128..1024 with ``with_grad`` True and False, against forward + backward
   of a local ``emb @ pool.T`` matmul of the same size (B x 64 x 2B, the similarity matrix that
   cross-rank mining computes). Both ranks start each round together (a barrier outside the timing);
   rank 0's median is reported.

Composer's launcher does not set ``OMP_NUM_THREADS``; when it is unset the CLI gives each of the N
local ranks ``cpu_count // N`` torch threads, or 1 where that is under 4 (see ``benchmarks/threads.py``).
On a 2-core machine each rank has one thread, and the 2 ranks share the two cores the single rank's one
thread had to itself. The stored results predate that rule: their caption says which counts ran.

    python benchmarks/distributed.py [--quick] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import in_units, load_average, machine_info, markdown_table, save_figure, write_results
from _common import parser as make_parser

ROOT = Path(__file__).resolve().parent.parent
FULL_RECIPE, QUICK_RECIPE = "yamls/mnist1d_default.yaml", "yamls/digits_quick.yaml"
FULL_BATCHES, QUICK_BATCHES = 60, 20
WARMUP_STEPS = 5  # per-step times of the first batches (lazy initialisation, allocator growth) dropped
STEP_RATE = re.compile(r"\[metric\]\[batch=(\d+)\]: throughput/batches_per_sec: ([-+0-9.eE]+)")
# (world size, cross_rank, gather): with one rank the gather is a no-op (all_gather_embeddings returns
# its input), a control for the overhead of the option itself.
FULL_CONFIGS = [
    (1, False, None),
    (1, True, "autograd"),
    (2, False, None),
    (2, True, "autograd"),
    (2, True, "constant"),
]
QUICK_CONFIGS = [(1, False, None), (2, False, None)]
FULL_GATHER_BATCHES, QUICK_GATHER_BATCHES = (128, 256, 512, 1024), (128,)
GATHER_DIM = 64
CAPTION = (
    "CPU, gloo. Composer's launcher does not set OMP_NUM_THREADS; with it unset the CLI gives each of the "
    "N local ranks cpu_count // N torch threads, or 1 where that is under 4 ({threads}). On this "
    "{cpus}-core machine, shared with other work, the ranks share its cores with each other and with that "
    "work, so the figures do not show scaling across machines."
)


def _threads(count: int) -> str:
    return f"{count} thread" + ("" if count == 1 else "s")


def cli_threads(cpus: int, local_ranks: int) -> int:
    """The torch threads per rank that ``composer_dynsample.cli.commands.set_cpu_threads`` picks."""
    share = max(1, cpus // local_ranks)
    return share if share >= 4 else 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def per_rank_batch(recipe: str) -> int:
    from omegaconf import OmegaConf

    sampler = OmegaConf.load(ROOT / recipe).sampler
    return int(sampler.classes_per_batch) * int(sampler.samples_per_class)


def launch(recipe: str, world: int, cross_rank: bool, gather: str | None, batches: int, work: Path) -> dict:
    """One training run through Composer's launcher: rank 0's per-step times, fit time and launch time."""
    name = f"w{world}_{'off' if not cross_rank else gather}_{batches}ba"
    run_dir, logs = work / name, work / f"{name}_logs"
    logs.mkdir(parents=True, exist_ok=True)
    overrides = [
        f"trainer.max_duration={batches}ba",
        "evaluation.interval=null",
        "trainer.save_folder=null",
        "trainer.progress_bar=false",
        f"algorithms.hard_negative_mining.cross_rank={str(cross_rank).lower()}",
        "callbacks.speed_monitor.window_size=1",
        f"loggers.file.filename={logs}/metrics-rank{{rank}}.txt",
    ]
    if cross_rank:
        overrides.append(f"algorithms.hard_negative_mining.gather={gather}")
    command = [
        sys.executable, "-m", "composer.cli.launcher", "-n", str(world), "--master_port", str(free_port()),
        "--stdout", str(logs / "rank{rank}.stdout"), "--stderr", str(logs / "rank{rank}.stderr"),
        "-m", "composer_dynsample", "train", recipe, *overrides, "--run-dir", str(run_dir),
    ]  # fmt: skip
    start = time.perf_counter()
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    launch_s = time.perf_counter() - start
    if out.returncode != 0:
        tails = [out.stdout[-2000:], out.stderr[-3000:]]
        tails += [
            f"{p.name}: {p.read_text()[-2000:]}" for p in sorted(logs.glob("rank*.std*")) if p.stat().st_size
        ]
        raise RuntimeError(f"launch {name} failed ({out.returncode}):\n" + "\n".join(tails))
    metrics = json.loads((run_dir / "metrics.json").read_text())
    # SpeedMonitor(window_size=1) logs, after every batch from the second on, 1 / (the wall time since the
    # previous batch ended): one step's time. The first WARMUP_STEPS are dropped.
    rates = {
        int(m.group(1)): float(m.group(2))
        for m in STEP_RATE.finditer((logs / "metrics-rank0.txt").read_text())
    }
    step_times = [1.0 / rate for batch, rate in sorted(rates.items()) if batch > WARMUP_STEPS and rate > 0]
    if not step_times:
        raise RuntimeError(f"launch {name}: no per-step throughput in {logs / 'metrics-rank0.txt'}")
    return {
        "step_times": step_times,
        "fit_s": float(metrics["wall_time_s"]),
        "batches": int(metrics["batches"]),
        "launch_s": launch_s,
    }


def training(quick: bool, work: Path) -> list[dict]:
    recipe = QUICK_RECIPE if quick else FULL_RECIPE
    batches = QUICK_BATCHES if quick else FULL_BATCHES
    batch = per_rank_batch(recipe)
    configs = QUICK_CONFIGS if quick else FULL_CONFIGS
    if quick:
        # A smoke test: the launches run concurrently to save start-up time, so the quick figures are
        # not measurements (the runs share the cores with each other).
        with ThreadPoolExecutor(len(configs)) as pool:
            runs = list(pool.map(lambda c: launch(recipe, *c, batches, work), configs))
    else:
        runs = [launch(recipe, *c, batches, work) for c in configs]
    rows = []
    for (world, cross_rank, gather), run in zip(configs, runs):
        step_s = statistics.median(run["step_times"])
        quartiles = (
            statistics.quantiles(run["step_times"], n=4) if len(run["step_times"]) > 1 else [step_s] * 3
        )
        rows.append(
            {
                "recipe": recipe,
                "world_size": world,
                "cross_rank": cross_rank,
                "gather": gather,
                "per_rank_batch": batch,
                "global_batch": batch * world,
                "step_ms": round(step_s * 1e3, 2),
                "step_ms_quartiles": [round(q * 1e3, 2) for q in (quartiles[0], quartiles[2])],
                "steps_per_s": round(1 / step_s, 2),
                "samples_per_s": round(batch * world / step_s, 1),
                "timed_steps": len(run["step_times"]),
                "fit_s": run["fit_s"],
                "fit_ms_per_batch": round(run["fit_s"] / run["batches"] * 1e3, 2),
                "batches": run["batches"],
                "launch_s": round(run["launch_s"], 2),
                "startup_s": round(run["launch_s"] - run["fit_s"], 2),
            }
        )
        print(
            f"  trained world={world} cross_rank={cross_rank} gather={gather}: median {rows[-1]['step_ms']} "
            f"ms/step, fit {run['fit_s']:.1f} s, launch {run['launch_s']:.1f} s",
            flush=True,
        )
    return rows


# --------------------------------------------------------------------------------------------- all-gather
def gather_worker(batches: list[int], rounds: int, out_file: str | None) -> None:
    """One rank of the all-gather micro-benchmark (RANK etc. in the environment)."""
    import torch
    import torch.distributed as torch_dist

    from composer_dynsample.distributed import all_gather_embeddings

    torch.set_num_threads(1)
    torch_dist.init_process_group("gloo")
    rank, world = torch_dist.get_rank(), torch_dist.get_world_size()
    gen = torch.Generator().manual_seed(rank)
    rows = []
    for batch in batches:
        emb = torch.randn(batch, GATHER_DIM, generator=gen).requires_grad_(True)
        labels = torch.arange(batch) // 8
        weight = torch.randn(world * batch, GATHER_DIM, generator=gen)
        ref = torch.randn(world * batch, GATHER_DIM, generator=gen)

        def gather(with_grad: bool, emb=emb, labels=labels, weight=weight) -> None:
            pool, _, _ = all_gather_embeddings(emb, labels, with_grad=with_grad)
            (pool * weight).sum().backward()  # with_grad: the backward all-reduces the pool's gradient

        def matmul(emb=emb, ref=ref) -> None:
            (emb @ ref.T).sum().backward()

        fns = {
            "gather_constant": lambda: gather(False),
            "gather_autograd": lambda: gather(True),
            "matmul": matmul,
        }
        samples: dict[str, list[float]] = {name: [] for name in fns}
        for round_ in range(rounds + 2):  # two warm-up rounds
            for name, fn in fns.items():
                torch_dist.barrier()
                start = time.perf_counter()
                fn()
                elapsed = time.perf_counter() - start
                emb.grad = None
                if round_ >= 2:
                    samples[name].append(elapsed)
        medians = {name: statistics.median(v) for name, v in samples.items()}
        rows.append(
            {
                "batch": batch,
                "dim": GATHER_DIM,
                "pool_rows": world * batch,
                **in_units(medians),
                "constant_over_matmul": round(medians["gather_constant"] / medians["matmul"], 2),
                "autograd_over_matmul": round(medians["gather_autograd"] / medians["matmul"], 2),
            }
        )
    torch_dist.barrier()  # every collective of both ranks is done
    if rank == 0 and out_file:
        Path(out_file).write_text(json.dumps({"rows": rows, "rounds": rounds}))
    # No destroy_process_group(): under load rank 0 sometimes waited in gloo's teardown for a peer that had
    # already exited, and the benchmark hung until its timeout. Past the barrier there is nothing to tear down.
    sys.stderr.flush()
    os._exit(0)


def gather_benchmark(quick: bool, work: Path) -> dict:
    batches = QUICK_GATHER_BATCHES if quick else FULL_GATHER_BATCHES
    rounds = 5 if quick else 30
    out_file = work / "gather.json"
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    logs = [work / f"gather-rank{rank}.log" for rank in range(2)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--gather-worker",
                json.dumps(list(batches)),
                str(rounds),
                str(out_file),
            ],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=log.open("w"),
        )
        for rank, log in enumerate(logs)
    ]
    errors = wait_for_ranks(procs, logs, timeout=300)
    if errors:
        raise RuntimeError("all-gather benchmark failed:\n" + "\n".join(errors))
    return json.loads(out_file.read_text())


def wait_for_ranks(procs: list[subprocess.Popen], logs: list[Path], timeout: float) -> list[str]:
    """Wait for every rank; when one fails or time runs out, end the others (they would wait forever).

    Returns:
        One line per rank that did not exit 0, with the end of its stderr (its log file).
    """
    deadline = time.monotonic() + timeout
    while any(proc.poll() is None for proc in procs):
        failed = any(proc.returncode not in (None, 0) for proc in procs)
        if failed or time.monotonic() > deadline:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
            break
        time.sleep(0.2)
    errors = []
    for rank, (proc, log) in enumerate(zip(procs, logs)):
        if proc.wait() != 0:
            errors.append(f"rank {rank} exited {proc.returncode}: {log.read_text()[-2000:]}")
    return errors


# ------------------------------------------------------------------------------------------------- report
def plot(train_rows: list[dict], gather_rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    labels = [f"{r['world_size']} rank{'s' if r['world_size'] > 1 else ''}\n" + (r["gather"] or "cross-rank off")
              for r in train_rows]  # fmt: skip
    colors = ["tab:blue" if r["world_size"] == 1 else "tab:orange" for r in train_rows]
    bars = left.bar(range(len(train_rows)), [r["samples_per_s"] for r in train_rows], color=colors)
    for bar, r in zip(bars, train_rows):
        left.annotate(f"{r['steps_per_s']:.1f} steps/s", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                      ha="center", va="bottom", fontsize=8)  # fmt: skip
    left.set_xticks(range(len(train_rows)), labels, fontsize=8)
    left.set_ylabel("training samples / s (all ranks)")
    left.set_title(f"training throughput, {train_rows[0]['recipe']}")
    for key, label in (("gather_constant_ms", "gather=constant"), ("gather_autograd_ms", "gather=autograd"),
                       ("matmul_ms", "local emb @ pool.T")):  # fmt: skip
        right.plot([r["batch"] for r in gather_rows], [r[key] for r in gather_rows], marker="o", label=label,
                   **({"color": "black", "linestyle": "--"} if key == "matmul_ms" else {}))  # fmt: skip
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xlabel(f"per-rank batch B (D = {GATHER_DIM}, 2 ranks)")
    right.set_ylabel("median forward + backward (ms)")
    right.set_title("all_gather_embeddings vs a local matmul")
    right.grid(True, which="both", alpha=0.3)
    right.legend(fontsize=8)
    fig.suptitle(textwrap.fill(title, 170), fontsize=8)
    save_figure(fig, path, rect=(0, 0, 1, 0.9))


def tables(train_rows: list[dict], gather: dict, caption: str, quick: bool) -> str:
    """Table 1 (training throughput per launch) and Table 2 (all-gather against a local matmul)."""
    training_table = markdown_table(
        [
            "ranks",
            "cross-rank mining",
            "global batch",
            "ms / step",
            "steps / s",
            "samples / s",
            "start-up (s)",
        ],
        "rlrrrrr",
        [
            [
                r["world_size"],
                f"on, gather={r['gather']}" if r["cross_rank"] else "off",
                r["global_batch"],
                f"{r['step_ms']:.1f}",
                f"{r['steps_per_s']:.2f}",
                f"{r['samples_per_s']:.0f}",
                f"{r['startup_s']:.1f}",
            ]
            for r in train_rows
        ],
    )
    method = (
        f"median per-step time over batches {WARMUP_STEPS + 1}..{train_rows[0]['batches']} on rank 0 "
        "(SpeedMonitor, window 1)"
    )
    if quick:
        method += "; quick: the launches ran concurrently, not a measurement"
    gather_table = markdown_table(
        [
            "B per rank",
            "pool rows",
            "gather=constant (ms)",
            "gather=autograd (ms)",
            "local matmul (ms)",
            "constant / matmul",
            "autograd / matmul",
        ],
        "rrrrrrr",
        [
            [
                g["batch"],
                g["pool_rows"],
                f"{g['gather_constant_ms']:.3f}",
                f"{g['gather_autograd_ms']:.3f}",
                f"{g['matmul_ms']:.3f}",
                f"{g['constant_over_matmul']:.2f}",
                f"{g['autograd_over_matmul']:.2f}",
            ]
            for g in gather["rows"]
        ],
    )
    return "\n\n".join(
        [
            training_table,
            f"Table 1: {train_rows[0]['recipe']}, {method}. {caption}",
            gather_table,
            f"Table 2: all_gather_embeddings forward + backward on 2 gloo ranks (127.0.0.1, 1 thread each, D = "
            f"{GATHER_DIM}, median of {gather['rounds']} rounds on rank 0) vs forward + backward of emb @ pool.T.",
        ]
    )


def summary(train_rows: list[dict], gather_rows: list[dict]) -> tuple[str, str, float]:
    """The goal, the measured sentence and 2 ranks' / 1 rank's samples/s with cross-rank mining off."""

    def pick(world: int, cross_rank: bool, gather_mode: str | None = None) -> dict | None:
        key = (world, cross_rank, gather_mode)
        return next((r for r in train_rows if (r["world_size"], r["cross_rank"], r["gather"]) == key), None)

    one, two = pick(1, False), pick(2, False)
    ratio = two["samples_per_s"] / one["samples_per_s"]
    goal = "2 ranks at least as many samples/s as 1 rank (cross-rank off); cross-rank mining costs little per step"
    measured = f"2 ranks / 1 rank samples/s (cross-rank off) = {ratio:.2f}"
    for mode in ("autograd", "constant"):
        on = pick(2, True, mode)
        if on is not None:
            measured += f"; 2 ranks gather={mode}: {on['step_ms'] / two['step_ms']:.2f}x the step time of cross-rank off"
    big = gather_rows[-1]
    measured += (
        f"; all-gather at B={big['batch']}: constant {big['gather_constant_ms']:.2f} ms, "
        f"autograd {big['gather_autograd_ms']:.2f} ms, local matmul {big['matmul_ms']:.2f} ms"
    )
    return goal, measured, ratio


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser(__doc__, quick_help="digits_quick, cross-rank off only, one B")
    parser.add_argument(
        "--gather-worker", nargs=3, metavar=("BATCHES", "ROUNDS", "OUT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.gather_worker:
        batches, rounds, out_file = args.gather_worker
        gather_worker(json.loads(batches), int(rounds), out_file)
        return {}

    load_before = load_average()
    cpus = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="dynsample-dist-bench-") as tmp:
        train_rows = training(args.quick, Path(tmp))
        gather = gather_benchmark(args.quick, Path(tmp))
    gather_rows = gather["rows"]
    omp = os.environ.get("OMP_NUM_THREADS")
    threads = (
        f"OMP_NUM_THREADS={omp} is set here, so it applies instead"
        if omp
        else f"1 rank: {_threads(cli_threads(cpus, 1))}, 2 ranks: {_threads(cli_threads(cpus, 2))} each"
    )
    caption = CAPTION.format(threads=threads, cpus=cpus)
    table = tables(train_rows, gather, caption, args.quick)
    goal, measured, ratio = summary(train_rows, gather_rows)
    print(f"{table}\n\ngoal: {goal}\nmeasured: {measured}")
    config = {
        "quick": args.quick,
        "recipe": train_rows[0]["recipe"],
        "batches": QUICK_BATCHES if args.quick else FULL_BATCHES,
        "warmup_steps_dropped": WARMUP_STEPS,
        "cpus": cpus,
        "omp_num_threads": omp,
        "machine": machine_info(torch_threads=False),
        "load_average_1_5_15min_before": load_before,
        "load_average_1_5_15min_after": load_average(),
    }
    result = {
        "ratio": round(ratio, 3),
        "ratio_meaning": "samples/s on 2 CPU ranks / samples/s on 1 CPU rank, cross-rank mining off, same "
        "per-rank batch (2 ranks share the machine's cores)",
        "goal": goal,
        "measured": measured,
        "caption": caption,
        "training": train_rows,
        "all_gather": gather_rows,
        "config": config,
    }
    notes = [f"goal: {goal}", f"measured: {measured}"]
    draw = lambda path: plot(train_rows, gather_rows, path, caption)  # noqa: E731
    return write_results(args.out, "distributed", args.quick, result, table, notes=notes, plot=draw)


if __name__ == "__main__":
    main()
