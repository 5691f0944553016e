"""Check 5 of ``gpu.py``: a cross-rank InfoNCE step in 2 processes (NCCL on 2 GPUs, or gloo on the CPU).

Each rank embeds its half of one batch with a shared linear encoder, gathers the pool with
:func:`~composer_dynsample.distributed.all_gather_embeddings` (``with_grad=True``), mines ``batch_hard``
against it and takes an :class:`~composer_dynsample.InfoNCELoss` step with ``global_mean=True``; the
gradient averaged over the ranks (what DDP does) must equal one process's gradient on the concatenated
batch with the same tuples. Run as a script, this file is one rank::

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python benchmarks/_gpu_ranks.py nccl cuda 1024 20
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _cuda import synchronize
from _mined_tuples import compare_tuples

DIST_IN, DIST_OUT = 64, 32


def free_port() -> int:
    """A TCP port free on this machine now, for the process group's rendezvous."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def every_ranks_tuples(
    tuples: tuple[torch.Tensor, ...], batch: int, all_gather_rows: Callable[[torch.Tensor], torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """Every rank's batch_hard triplets (at most one per anchor) in the concatenated batch's numbering.

    The pool is in rank order, so positives and negatives are already numbered that way; anchor ``i`` of
    rank ``r`` becomes ``r * batch + i``.
    """
    anchors, positives, negatives = tuples
    chosen = torch.full((2, batch), -1, dtype=torch.int64, device=anchors.device)  # -1: no triplet
    chosen[0, anchors] = positives
    chosen[1, anchors] = negatives
    every = all_gather_rows(chosen).permute(1, 0, 2).reshape(2, -1)
    keep = every[0] >= 0
    return keep.nonzero().view(-1), every[0][keep], every[1][keep]


def cross_rank_step(device: torch.device, batch: int, steps: int) -> dict[str, Any]:
    """In a rank of a process group: the cross-rank InfoNCE step, checked against one process, and timed."""
    import torch.distributed as torch_dist

    from composer_dynsample import InfoNCELoss
    from composer_dynsample.distributed import all_gather_embeddings, all_gather_rows
    from composer_dynsample.mining import BatchHardMiner

    rank, world = torch_dist.get_rank(), torch_dist.get_world_size()
    generator = torch.Generator().manual_seed(0)  # the same data and weights on every rank
    features = torch.randn(world * batch, DIST_IN, generator=generator).to(device)
    labels = torch.randint(0, max(world * batch // 8, 2), (world * batch,), generator=generator).to(device)
    encoder = torch.nn.Linear(DIST_IN, DIST_OUT)
    torch.nn.init.normal_(encoder.weight, generator=generator)
    torch.nn.init.zeros_(encoder.bias)
    encoder.to(device)
    loss_fn, own = InfoNCELoss(temperature=0.1), slice(rank * batch, (rank + 1) * batch)

    def step() -> tuple[torch.Tensor, tuple[torch.Tensor, ...], int]:
        encoder.zero_grad()
        local = torch.nn.functional.normalize(encoder(features[own]), dim=1)
        pool, pool_labels, offset = all_gather_embeddings(local, labels[own], with_grad=True)
        tuples = BatchHardMiner()(local.detach(), labels[own], pool.detach(), pool_labels, self_offset=offset)
        loss_fn(local, labels[own], tuples, pool, pool_labels, global_mean=True).backward()
        grad = encoder.weight.grad.clone()
        torch_dist.all_reduce(grad)  # what DDP does, then divides by the world size
        return grad / world, tuples, offset

    grad, tuples, offset = step()
    full_tuples = every_ranks_tuples(tuples, batch, all_gather_rows)
    # One process on the concatenated batch with the same tuples.
    encoder.zero_grad()
    full = torch.nn.functional.normalize(encoder(features), dim=1)
    loss_fn(full, labels, full_tuples).backward()
    expected = encoder.weight.grad.clone()
    same_tuples = compare_tuples(BatchHardMiner()(full.detach(), labels), full_tuples, world * batch)
    times = []
    for _ in range(steps):
        torch_dist.barrier()
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return {
        "rank": rank,
        "backend": torch_dist.get_backend(),
        "offset_ok": offset == rank * batch,
        "grad_max_abs_diff": float((grad - expected).abs().max()),
        "grad_scale": float(expected.abs().max()),
        "grad_matches": bool(
            torch.allclose(grad, expected, rtol=1e-3, atol=1e-5 * float(expected.abs().max()))
        ),
        "tuples_as_one_process": same_tuples.equal,
        "tuples_differing": same_tuples.differing,
        "step_ms": statistics.median(times) * 1e3,
    }


def distributed_worker(backend: str, device_kind: str, batch: int, steps: int) -> None:
    """One rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment); prints its JSON."""
    import torch.distributed as torch_dist

    rank = int(os.environ["RANK"])
    device = torch.device("cuda", rank) if device_kind == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch_dist.init_process_group(backend, rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
    result = cross_rank_step(device, batch, steps)
    torch_dist.barrier()  # every collective of both ranks is done
    print(json.dumps(result), flush=True)
    # No teardown: a rank sometimes waited in the process group's teardown for a peer that had already
    # exited (as benchmarks/distributed.py found with gloo), hanging until the launcher's timeout. Past
    # the barrier there is nothing left to finish.
    os._exit(0)


def launch_ranks(backend: str, device_kind: str, batch: int, steps: int, timeout_s: float) -> list[dict]:
    """Run :func:`distributed_worker` in 2 processes; each rank's JSON, or a RuntimeError with the cause.

    A rank that fails stops the other (which would wait for it in a collective until the timeout).
    """
    base = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    command = [sys.executable, str(Path(__file__).resolve()), backend, device_kind]
    with tempfile.TemporaryDirectory(prefix="gpu-check-ranks-") as folder:
        logs = [(Path(folder) / f"{rank}.out", Path(folder) / f"{rank}.err") for rank in range(2)]
        procs = []
        for rank, (out, err) in enumerate(logs):
            with out.open("w") as stdout, err.open("w") as stderr:
                env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
                procs.append(
                    subprocess.Popen(
                        [*command, str(batch), str(steps)], env=env, stdout=stdout, stderr=stderr
                    )
                )
        failure = wait_for_ranks(procs, timeout_s)
        texts = [(out.read_text(), err.read_text()) for out, err in logs]
    if failure is not None:
        rank, code = failure
        if code is None:
            raise RuntimeError(f"the 2 ranks did not finish within {timeout_s:.0f} s")
        lines = [line for line in texts[rank][1].splitlines() if line.strip()]
        raise RuntimeError(f"rank {rank} exited with {code}: {lines[-1] if lines else 'no output'}")
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in texts]


def wait_for_ranks(procs: list[subprocess.Popen], timeout_s: float) -> tuple[int, int | None] | None:
    """Wait for every process; on the first failure (or the timeout) stop the others.

    Returns:
        ``None`` when all exited with 0, else ``(rank, exit code)`` of the first that failed (``None``
        as the code on a timeout).
    """
    deadline, failure = time.monotonic() + timeout_s, None
    while failure is None and any(proc.poll() is None for proc in procs):
        failed = [(rank, proc.returncode) for rank, proc in enumerate(procs) if proc.returncode]
        if failed:
            failure = failed[0]
        elif time.monotonic() > deadline:
            failure = (0, None)
        else:
            time.sleep(0.1)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    if failure is None:
        failed = [(rank, proc.returncode) for rank, proc in enumerate(procs) if proc.returncode]
        failure = failed[0] if failed else None
    return failure


def check_nccl(device: torch.device, batch: int, steps: int, timeout_s: float = 240) -> dict:
    """The cross-rank step on 2 ranks of ``batch`` rows each: ``ok`` when both ranks' gradients match.

    NCCL on 2 CUDA devices; with ``device`` the CPU, the same check over gloo (what the tests run).
    """
    backend = "nccl" if device.type == "cuda" else "gloo"
    start = time.perf_counter()
    ranks = launch_ranks(backend, device.type, batch, steps, timeout_s=timeout_s)
    wall = time.perf_counter() - start
    ok = all(r["grad_matches"] and r["offset_ok"] for r in ranks)
    worst = max(r["grad_max_abs_diff"] for r in ranks)
    summary = (
        f"2 ranks x B = {batch} over {ranks[0]['backend']}: gradient {'equals' if ok else 'DIFFERS from'} one "
        f"process's on the whole batch (max abs diff {worst:.1e}); step {ranks[0]['step_ms']:.2f} ms; "
        f"tuples as one process mines them: {all(r['tuples_as_one_process'] for r in ranks)}"
    )
    return {"status": "ok" if ok else "failed", "summary": summary, "ranks": ranks, "launch_s": wall}


if __name__ == "__main__":
    distributed_worker(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
