"""Training data read from MosaicML Streaming MDS shards against the same data read from its file, side by side.

Synthetic pairs (``--pairs``, default 20,000: a query of 6 to 16 words and a code line of 12 to 40 words
sharing some of them, from 3,000 made-up words) are loaded as ``data: {name: pairs}`` loads them
(``load_pairs``, WordPiece vocabulary 2,000, max_length 64), then written with ``convert_to_mds``
(``--shard-size``, default 1mb, zstd) and read back with ``load_streaming``. Each variant runs one epoch
of the same loop: ``DataLoader(IndexDataset(store.labels), batch_sampler=PKBatchSampler(labels, P, 2),
collate_fn=TextCollate(store), num_workers=W)`` (P = 128 pairs, 256 rows a batch; fork workers,
``prefetch_factor`` 2, started inside the timed epoch) and, per batch, a fixed synthetic training step
(``nn.EmbeddingBag`` of width 256 on the batch's ``input_ids``, a ``Linear``, an InfoNCE loss over the
batch's pairs, backward, an Adam step; seeded alike in every run) on ``--threads`` torch threads:

* **file**: the splits ``load_pairs`` returned (the memory-mapped token cache);
* **streaming, warm cache**: ``load_streaming`` of the converted folder (a local path as the remote) into
  a fresh ``local`` folder that is a copy of one a previous full pass filled: every shard already there;
* **streaming, cold cache over HTTP**: the converted folder uploaded to moto's S3 server on this machine,
  ``remote="s3://.../mds"`` (``S3_ENDPOINT_URL``), a fresh, empty ``local`` folder: every shard a batch
  needs is downloaded, checked (xxh3_64) and decompressed when the batch is collated.

Timed per epoch: its wall time (DataLoader start, every batch, every step) and, per step, the wait for
the next batch (``next(iterator)``: the stall; the first one includes starting the workers). Opening
the data (``load_pairs`` from its cache, or ``load_streaming``: the manifest and per-row arrays) is
timed apart. The variants run interleaved for num_workers 0 and 2, ``--repeats`` times (their order
rotated each repeat); the tables give medians. Goal: the warm cache's seconds per step at most 1.05x
the file's, for each num_workers. Every ``load_streaming`` gets its own ``local`` folder and the
readers are closed between runs (``StreamingDataset`` allows one reader per folder and process).

    python benchmarks/streaming.py [--pairs 20000] [--repeats 5] [--shard-size 1mb] [--threads 1]
                                   [--quick] [--out benchmarks/results]

``--quick`` (3,000 pairs, 1 repeat) is a smoke test, written to ``streaming_quick.*``.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import LoadWatch, goal_table, markdown_table, write_results
from _common import parser as make_parser

from composer_dynsample.data import IndexDataset, TextCollate
from composer_dynsample.data.streaming import close_readers, convert_to_mds, load_streaming
from composer_dynsample.data.text.pairs import load_pairs
from composer_dynsample.samplers import PKBatchSampler

# Run as a script, this file's folder comes first on sys.path, where this file (streaming.py) would shadow
# MosaicML's ``streaming`` package that the readers import on first use: the folder goes (``_common`` is in).
sys.path[:] = [p for p in sys.path if Path(p or os.curdir).resolve() != Path(__file__).resolve().parent]

NAME = "streaming"
CLASSES_PER_BATCH, SAMPLES_PER_CLASS = 128, 2  # P x K: 128 pairs, 256 rows a batch
MAX_LENGTH, VOCAB_SIZE, TEST_PAIRS = 64, 2000, 500
WIDTH = 256  # the synthetic step's embedding width
WORKERS = (0, 2)
VARIANTS = ("file", "warm", "cold")
LABELS = {
    "file": "file (load_pairs)",
    "warm": "streaming, warm cache",
    "cold": "streaming, cold cache over HTTP (moto S3)",
}
GOAL = 1.05
BUCKET, PREFIX = "bench-streaming", "mds"
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def synthetic_pairs(count: int, seed: int) -> list[dict[str, str]]:
    """``count`` pairs: a query of 6 to 16 made-up words and a code line of 12 to 40 that uses some of them."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, rng.integers(3, 10))) for _ in range(3000)]
    rows = []
    for i in range(count):
        query = [words[j] for j in rng.integers(0, len(words), rng.integers(6, 17)).tolist()]
        extra = [words[j] for j in rng.integers(0, len(words), rng.integers(12, 41)).tolist()]
        shared = query[: max(2, len(query) // 2)]
        body = " ".join(f"{a}_{b}(x)" for a, b in zip(shared + extra[::2], extra[1::2]))
        rows.append({"anchor": f"how to {' '.join(query)} item {i}", "positive": f"def f{i}(x): {body}"})
    return rows


def write_jsonl(path: Path, rows: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def read_pairs_file(folder: Path) -> Any:
    """``load_pairs`` of the pairs in ``folder`` (its token cache in ``folder/cache``): the file variant."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the truncation report
        return load_pairs(
            folder / "train.jsonl",
            test_path=folder / "test.jsonl",
            cache_dir=folder / "cache",
            max_length=MAX_LENGTH,
            vocab_size=VOCAB_SIZE,
            progress=False,
        )


def build_data(folder: Path, pairs: int, shard_size: str) -> dict[str, Any]:
    """Write the pairs, load them (timed), convert them (timed); the splits, the MDS folder and their sizes."""
    write_jsonl(folder / "train.jsonl", synthetic_pairs(pairs, seed=0))
    write_jsonl(folder / "test.jsonl", synthetic_pairs(TEST_PAIRS, seed=1))
    start = time.perf_counter()
    read_pairs_file(folder)  # trains the tokenizer, tokenizes, caches
    tokenize_s = time.perf_counter() - start
    start = time.perf_counter()
    splits = read_pairs_file(folder)  # what the file variant reads
    reload_s = time.perf_counter() - start
    start = time.perf_counter()
    mds = convert_to_mds(splits, folder / "mds", shard_size=shard_size, compression="zstd")
    convert_s = time.perf_counter() - start
    manifest = json.loads((mds / "manifest.json").read_text())
    index = json.loads((mds / "train" / "index.json").read_text())
    store = splits.train
    sizes = {
        "pairs": pairs,
        "test_pairs": TEST_PAIRS,
        "rows": int(store.num_rows),
        "tokens": int(store.lengths(np.arange(store.num_rows)).sum()),
        "shards": int(manifest["splits"]["train"]["shards"]),
        "test_shards": int(manifest["splits"]["test"]["shards"]),
        "shard_size": shard_size,
        "compression": "zstd",
        "mds_mb": round(folder_bytes(mds) / 1e6, 3),
        "train_shards_mb": round(sum(s["zip_data"]["bytes"] for s in index["shards"]) / 1e6, 3),
        "train_shards_uncompressed_mb": round(sum(s["raw_data"]["bytes"] for s in index["shards"]) / 1e6, 3),
        "token_cache_mb": round(folder_bytes(folder / "cache") / 1e6, 3),
    }
    timings = {
        "tokenize_s": round(tokenize_s, 3),
        "reload_s": round(reload_s, 4),
        "convert_s": round(convert_s, 3),
    }
    return {
        "folder": folder,
        "splits": splits,
        "mds": mds,
        "sizes": sizes,
        "timings": timings,
        "index": index,
    }


def forget_readers() -> None:
    """Close this process's shard readers, so the next ``load_streaming`` opens its own."""
    close_readers()
    gc.collect()


def fill_cache(mds: Path, local: Path) -> dict[str, Any]:
    """One full pass over the training rows into ``local`` (the warm cache the warm runs copy)."""
    start = time.perf_counter()
    streamed = load_streaming(str(mds), local)
    store = streamed.train
    for begin in range(0, store.num_rows, 4096):
        store.tokens.pad(np.arange(begin, min(begin + 4096, store.num_rows)), store.pad_id)
    seconds = time.perf_counter() - start
    del streamed, store
    forget_readers()
    return {"fill_s": round(seconds, 3), "shards": len(list((local / "train").glob("shard.*.mds")))}


@contextlib.contextmanager
def s3_server(mds: Path) -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 with ``mds`` uploaded whole; yields the ``s3://`` remote."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    saved = {key: os.environ.get(key) for key in (*S3_ENV, "S3_ENDPOINT_URL")}
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        os.environ.update({**S3_ENV, "S3_ENDPOINT_URL": f"http://{host}:{port}"})
        client = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"])
        client.create_bucket(Bucket=BUCKET)
        for path in sorted(mds.rglob("*")):
            if path.is_file():
                client.upload_file(str(path), BUCKET, f"{PREFIX}/{path.relative_to(mds).as_posix()}")
        yield f"s3://{BUCKET}/{PREFIX}"
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def make_step(vocab_size: int, pad_id: int):
    """A fixed training step of a few milliseconds: EmbeddingBag, Linear, InfoNCE over the pairs, Adam."""
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(vocab_size, WIDTH, mode="mean", padding_idx=pad_id)
    head = torch.nn.Linear(WIDTH, WIDTH)
    optimizer = torch.optim.Adam([*bag.parameters(), *head.parameters()], lr=1e-3)

    def step(batch: dict[str, Any]) -> float:
        labels = batch["labels"]
        embeddings = torch.nn.functional.normalize(head(bag(batch["features"]["input_ids"].long())), dim=1)
        logits = embeddings @ embeddings.T / 0.05
        self_mask = torch.eye(len(labels), dtype=torch.bool)
        partner = ((labels[:, None] == labels[None, :]) & ~self_mask).float().argmax(dim=1)
        loss = torch.nn.functional.cross_entropy(logits.masked_fill(self_mask, float("-inf")), partner)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    return step


def run_epoch(store: Any, workers: int, vocab_size: int, pad_id: int) -> dict[str, Any]:
    """One epoch of the loop: DataLoader start, every batch's wait (the stall) and step, timed."""
    sampler = PKBatchSampler(
        store.labels, CLASSES_PER_BATCH, SAMPLES_PER_CLASS, num_replicas=1, rank=0, seed=0
    )
    loader = torch.utils.data.DataLoader(
        IndexDataset(store.labels),
        batch_sampler=sampler,
        collate_fn=TextCollate(store),
        num_workers=workers,
        **({"multiprocessing_context": "fork", "prefetch_factor": 2} if workers else {}),
    )
    step = make_step(vocab_size, pad_id)
    stalls, steps, rows = [], [], 0
    start = time.perf_counter()
    iterator = iter(loader)
    waited = start
    while True:
        batch = next(iterator, None)
        now = time.perf_counter()
        if batch is None:
            break
        stalls.append(now - waited)
        step(batch)
        rows += len(batch["index"])
        waited = time.perf_counter()
        steps.append(waited - now)
    epoch_s = time.perf_counter() - start
    del iterator, loader  # shuts the workers down
    return {
        "steps": len(stalls),
        "rows": rows,
        "epoch_s": epoch_s,
        "s_per_step": epoch_s / len(stalls),
        "stall_mean_s": statistics.fmean(stalls),
        "stall_max_s": max(stalls),
        "first_stall_s": stalls[0],
        "later_stall_mean_s": statistics.fmean(stalls[1:]) if len(stalls) > 1 else 0.0,
        "step_compute_mean_s": statistics.fmean(steps),
    }


def run_variant(
    variant: str, workers: int, data: dict[str, Any], remote: str, warm: Path, scratch: Path
) -> dict:
    """Open the variant's splits (timed apart), run one epoch, and for the cold cache count the downloads."""
    splits = data["splits"]
    vocab_size, pad_id = splits.train.vocab_size, splits.train.pad_id
    if variant == "file":
        start = time.perf_counter()
        store = read_pairs_file(data["folder"]).train
        open_s = time.perf_counter() - start
        return {"open_s": open_s, **run_epoch(store, workers, vocab_size, pad_id)}
    local = Path(tempfile.mkdtemp(prefix=f"{variant}-w{workers}-", dir=scratch))
    if variant == "warm":
        shutil.copytree(warm, local, dirs_exist_ok=True)
    forget_readers()
    try:
        start = time.perf_counter()
        streamed = load_streaming(str(data["mds"]) if variant == "warm" else remote, local)
        open_s = time.perf_counter() - start
        result = {"open_s": open_s, **run_epoch(streamed.train, workers, vocab_size, pad_id)}
        del streamed
        if variant == "cold":
            result.update(downloads(local, data["index"]))
        return result
    finally:
        forget_readers()
        shutil.rmtree(local, ignore_errors=True)


def downloads(local: Path, index: dict[str, Any]) -> dict[str, Any]:
    """The training shards a cold run downloaded (those now in ``local``) and their bytes over HTTP."""
    names = {}
    for shard in index["shards"]:
        sent = (shard["zip_data"] or shard["raw_data"])["bytes"]
        for data in (shard["raw_data"], shard["zip_data"]):
            if data is not None:
                names[data["basename"]] = (shard["raw_data"]["basename"], sent)
    touched = dict(names[path.name] for path in (local / "train").glob("shard.*") if path.name in names)
    metadata = sum(
        p.stat().st_size for p in local.rglob("*") if p.is_file() and not p.name.startswith("shard.")
    )
    return {
        "shards_downloaded": len(touched),
        "shard_bytes": sum(touched.values()),
        "metadata_bytes": metadata,
    }


def summarise(runs: list[dict]) -> dict[tuple[str, int], dict[str, Any]]:
    """Medians of each (variant, workers) over its repeats."""
    keys = ("s_per_step", "epoch_s", "stall_mean_s", "stall_max_s", "first_stall_s", "later_stall_mean_s")
    keys += ("step_compute_mean_s", "open_s", "shards_downloaded", "shard_bytes", "metadata_bytes")
    out = {}
    for variant in VARIANTS:
        for workers in WORKERS:
            chosen = [r for r in runs if r["variant"] == variant and r["workers"] == workers]
            out[variant, workers] = {
                key: statistics.median(r[key] for r in chosen) for key in keys if key in chosen[0]
            } | {"repeats": len(chosen), "steps": chosen[0]["steps"]}
    return out


def tables(medians: dict, sizes: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    body = []
    for workers in WORKERS:
        file = medians["file", workers]["s_per_step"]
        for variant in VARIANTS:
            m = medians[variant, workers]
            shards = (
                f"{m['shards_downloaded']:g} of {sizes['shards']} ({m['shard_bytes'] / 1e6:.2f} MB)"
                if variant == "cold"
                else "-"
            )
            body.append(
                [
                    LABELS[variant],
                    workers,
                    f"{1000 * m['s_per_step']:.2f}",
                    f"{m['s_per_step'] / file:.3f}",
                    f"{1000 * m['stall_mean_s']:.2f}",
                    f"{1000 * m['stall_max_s']:.1f}",
                    f"{1000 * m['later_stall_mean_s']:.2f}",
                    f"{m['open_s']:.3f}",
                    shards,
                ]
            )
    header = [
        "data",
        "workers",
        "ms per step",
        "/ file",
        "stall mean (ms)",
        "stall max (ms)",
        "stall after the first (ms)",
        "open (s)",
        "shards downloaded",
    ]
    goals = []
    for workers in WORKERS:
        ratio = medians["warm", workers]["s_per_step"] / medians["file", workers]["s_per_step"]
        goals.append(
            {
                "goal": f"warm cache / file seconds per step <= {GOAL}, {workers} workers",
                "measured": f"{ratio:.3f}",
                "met": bool(ratio <= GOAL),
            }
        )
    return markdown_table(header, "lrrrrrrrl", body), goals


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser(__doc__, quick_help="3,000 pairs, 1 repeat: a smoke test", threads=1)
    parser.add_argument(
        "--pairs", type=int, default=None, help="training pairs (default 20,000; --quick 3,000)"
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="runs of each variant (default 5; --quick 1)"
    )
    parser.add_argument("--shard-size", default="1mb", help="convert_to_mds shard_size (default 1mb)")
    args = parser.parse_args(argv)
    pairs = args.pairs or (3000 if args.quick else 20_000)
    repeats = args.repeats or (1 if args.quick else 5)
    torch.set_num_threads(args.threads)
    load = LoadWatch()
    wall = time.perf_counter()
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="dynsample-streaming-") as root:
        data = build_data(Path(root), pairs, args.shard_size)
        warm = Path(root) / "warm"
        fill = fill_cache(data["mds"], warm)
        scratch = Path(root) / "runs"
        scratch.mkdir()
        with s3_server(data["mds"]) as remote:
            run_epoch(data["splits"].train, 0, data["splits"].train.vocab_size, data["splits"].train.pad_id)
            for repeat in range(repeats):
                order = VARIANTS[repeat % 3 :] + VARIANTS[: repeat % 3]
                for workers in WORKERS:
                    for variant in order:
                        result = run_variant(variant, workers, data, remote, warm, scratch)
                        runs.append({"variant": variant, "workers": workers, "repeat": repeat, **result})
                        print(
                            f"repeat {repeat} {variant:>4} w{workers}: {1000 * result['s_per_step']:.2f} ms/step, "
                            f"stall mean {1000 * result['stall_mean_s']:.2f} ms, max {1000 * result['stall_max_s']:.1f} ms",
                            flush=True,
                        )
    medians = summarise(runs)
    sizes = data["sizes"]
    table, goals = tables(medians, sizes)
    ratios = {w: medians["warm", w]["s_per_step"] / medians["file", w]["s_per_step"] for w in WORKERS}
    cold = {
        str(w): {
            "stall_mean_ms": round(1000 * medians["cold", w]["stall_mean_s"], 3),
            "stall_max_ms": round(1000 * medians["cold", w]["stall_max_s"], 2),
            "first_stall_s": round(medians["cold", w]["first_stall_s"], 4),
            "later_stall_mean_ms": round(1000 * medians["cold", w]["later_stall_mean_s"], 3),
            "s_per_step_over_file": round(
                medians["cold", w]["s_per_step"] / medians["file", w]["s_per_step"], 3
            ),
            "shards_downloaded": medians["cold", w]["shards_downloaded"],
            "shards_total": sizes["shards"],
            "shard_mb_downloaded": round(medians["cold", w]["shard_bytes"] / 1e6, 3),
            "metadata_mb_downloaded": round(medians["cold", w]["metadata_bytes"] / 1e6, 3),
        }
        for w in WORKERS
    }
    steps = medians["file", 0]["steps"]
    total_s = time.perf_counter() - wall
    notes = [
        goal_table(goals),
        f"{'--quick smoke run: ' if args.quick else ''}{sizes['pairs']:,} synthetic training pairs "
        f"({sizes['rows']:,} rows, {sizes['tokens']:,} tokens, max_length {MAX_LENGTH}, vocabulary "
        f"{VOCAB_SIZE}), {steps} steps an epoch of {CLASSES_PER_BATCH} x {SAMPLES_PER_CLASS} rows; MDS: "
        f"{sizes['shards']} training shards of at most {sizes['shard_size']} ({sizes['train_shards_mb']:.2f} MB "
        f"zstd, {sizes['train_shards_uncompressed_mb']:.2f} MB raw), the token cache "
        f"{sizes['token_cache_mb']:.2f} MB. Medians of {repeats} interleaved repeat(s); the step: EmbeddingBag "
        f"{WIDTH} + Linear + InfoNCE + Adam, {args.threads} torch thread(s), "
        f"{1000 * medians['file', 0]['step_compute_mean_s']:.2f} ms of compute a step (file, 0 workers).",
        "Stall: the wait for the next batch (`next(iterator)`), the first one with the workers' start; "
        "open: `load_pairs` from its cache or `load_streaming` (manifest and per-row arrays), not in the "
        "epoch. Cold cache: moto's S3 server on this machine (no network latency), a fresh `local` folder "
        "each run; shards downloaded are the training shards in it after the epoch.",
        f"Machine: {load.fields()['machine']}; {load.note()}; the whole run {total_s:.0f} s.",
    ]
    print(table + "\n\n" + "\n\n".join(notes))
    result = {
        "ratio": round(ratios[0], 4),
        "ratio_meaning": "streaming with a warm cache / file seconds per step (one epoch, 0 DataLoader workers)",
        "goal": f"warm cache / file seconds per step <= {GOAL}, for num_workers 0 and 2",
        "goals": goals,
        "ratios_by_workers": {str(w): round(r, 4) for w, r in ratios.items()},
        "cold": cold,
        "sizes": sizes,
        "timings": {**data["timings"], **fill, "total_s": round(total_s, 1)},
        "config": {
            "pairs": pairs,
            "repeats": repeats,
            "shard_size": args.shard_size,
            "batch": f"{CLASSES_PER_BATCH} x {SAMPLES_PER_CLASS}",
            "workers": list(WORKERS),
            "threads": args.threads,
            "step": f"EmbeddingBag({VOCAB_SIZE}, {WIDTH}) + Linear + InfoNCE + Adam",
            "quick": args.quick,
        },
        "medians": {f"{v}/{w}": m for (v, w), m in medians.items()},
        "runs": runs,
        **load.fields(),
    }
    return write_results(args.out, NAME, args.quick, result, table, notes=notes)


if __name__ == "__main__":
    main()
