"""The mined-negatives corpus search at 1 and 10 million pairs on a CUDA device: the own inverted file of every
anchor, and the exact search of a sample on the device and on the CPU (``_gpu_corpus.check_corpus_search``, the
``corpus_search`` check of ``gpu.py``), with the seconds, the window recall against the exact lists and the
device's peak memory. The figures behind the 10- and 100-million-pair projection of ``corpus_negatives.py``.

    python benchmarks/corpus_search_gpu.py [--pairs 1000000 10000000] [--anchors 256] [--device cuda]

Each size runs in its own process (``--one N``), so one that overruns or runs out of memory leaves the others.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from _common import machine_info, markdown_table, write_results
from _common import parser as make_parser


def one(pairs: int, anchors: int, device: str) -> dict:
    """One size, in this process."""
    from _gpu_corpus import check_corpus_search

    where = torch.device(device)
    if where.type == "cuda":
        torch.cuda.reset_peak_memory_stats(where)
    start = time.perf_counter()
    found = check_corpus_search(where, pairs, anchors)
    rows = {row["search"] + "_" + row["on"]: row for row in found["rows"]}
    ivf = rows[f"ivf_{where.type}"]
    return {
        "pairs": pairs, "status": found["status"], "ivf_s": ivf["seconds"], "window_recall": ivf["window_recall"],
        "exact_sample_device_s": rows[f"exact_{where.type}"]["seconds"], "exact_sample_cpu_s": rows["exact_cpu"]["seconds"],
        "sample": rows["exact_cpu"]["anchors"], "equal_to_cpu": rows[f"exact_{where.type}"].get("equal_to_cpu"),
        "peak_device_gib": round(torch.cuda.max_memory_allocated(where) / 2**30, 2) if where.type == "cuda" else None,
        "whole_s": round(time.perf_counter() - start, 1),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser(__doc__, quick_help="20,000 and 50,000 pairs, for the tests", threads=None)
    parser.add_argument(
        "--pairs", type=int, nargs="+", default=None, help="sizes (default 1,000,000 10,000,000)"
    )
    parser.add_argument("--anchors", type=int, default=256, help="the sample searched exactly (default 256)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--limit", type=float, default=400, help="seconds each size may take (default 400)")
    parser.add_argument("--one", type=int, help=argparse_hidden())
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one, args.anchors, args.device)))
        return {}
    sizes = args.pairs or ([20_000, 50_000] if args.quick else [1_000_000, 10_000_000])
    rows = []
    for pairs in sizes:
        command = [
            sys.executable,
            __file__,
            "--one",
            str(pairs),
            "--anchors",
            str(args.anchors),
            "--device",
            args.device,
        ]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.limit)
            last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
            row = (
                json.loads(last)
                if done.returncode == 0
                else {"pairs": pairs, "status": f"exit {done.returncode}: {done.stderr.strip()[-300:]}"}
            )
        except subprocess.TimeoutExpired:
            row = {"pairs": pairs, "status": f"not finished in {args.limit:.0f} s"}
        print(json.dumps(row), flush=True)
        rows.append(row)
    headers = ["pairs", "status", "ivf_s", "window_recall", "exact_sample_device_s", "exact_sample_cpu_s", "sample",
               "equal_to_cpu", "peak_device_gib", "whole_s"]  # fmt: skip
    table = markdown_table(headers, "rlrrrrrlrr", [[row.get(key, "") for key in headers] for row in rows])
    machine = machine_info()
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    heading = (
        f"The corpus search of mined negatives on {args.device} ({name}): "
        f"the own IVF of every anchor against every passage (D = 128), window recall over {args.anchors} anchors "
        "searched exactly; whole_s includes making the pairs."
    )
    result = {"device": args.device, "rows": rows, "machine": machine}
    write_results(args.out, "corpus_search_gpu", args.quick, result, f"{heading}\n\n{table}")
    print(f"{heading}\n\n{table}")
    return result


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
