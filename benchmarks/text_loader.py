"""The text loader's costs: tokenizing once, re-reading the cache, collating, and a memory-mapped corpus's RSS.

* **tokenize**: ``tokenize_texts`` on N synthetic texts (8 to 64 words drawn from 2,000 made-up words)
  with a WordPiece tokenizer trained on them (training not timed): ``encode_batch`` in chunks, the
  ids streamed into the memory-mapped token store, the text hashes, the atomic rename.
* **reread**: the same call again, which finds the cache and opens the store (``np.load(mmap_mode="r")``).
* **collate**: ``TextCollate`` rows/s on P x K = 128 x 2 batches from the tokenized texts (gather from
  the memmap, pad to the batch's longest row), in this process, no DataLoader.
* **memory**: 1,000,000 synthetic pairs of 128 tokens (2,000,000 texts, 1 GiB of ``uint32`` ids) written
  with ``TokenStoreWriter`` straight from random ids (no tokenizer). In a fresh process: the RSS growth
  of opening the store and building its ``TextStore`` (per-row metadata: text index, label, query flag,
  hash, source row, negatives' offsets), then of collating batches of 256 rows drawn at random, and the
  collate's rows/s on that store. RSS is split into anonymous memory (what the process allocated) and
  file-backed pages (the mapped token ids: page cache, shared by every DataLoader worker and dropped by
  the kernel under memory pressure). The kernel's read-ahead and fault-around map whole neighbourhoods
  of each row read, so after a few hundred random batches most of the file is mapped.

    python benchmarks/text_loader.py [--quick] [--out benchmarks/results] [--threads 1]

``--quick`` (20,000 texts, 20,000 pairs) is a smoke test; the full run writes a 1 GiB store into a
temporary folder and removes it.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from _common import load_average, machine_info, markdown_table, proc_status_kib, run_worker, write_results
from _common import parser as make_parser

from composer_dynsample.data.text_store import TextCollate, TextStore
from composer_dynsample.data.text_tokenizer import train_tokenizer
from composer_dynsample.data.tokenized import TokenStore, TokenStoreWriter, tokenize_texts
from composer_dynsample.samplers import PKBatchSampler

BATCH_CLASSES, TOKENS_PER_TEXT, VOCAB = 128, 128, 30_000


def synthetic_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` texts of 8 to 64 words drawn from 2,000 made-up words (``w0`` .. ``w1999`` spelled out)."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, rng.integers(3, 10))) for _ in range(2000)]
    lengths = rng.integers(8, 65, n)
    picks = rng.integers(0, len(words), int(lengths.sum()))
    texts, start = [], 0
    for length in lengths.tolist():
        texts.append(" ".join(words[i] for i in picks[start : start + length].tolist()))
        start += length
    return texts


def measure_tokenizing(n: int, folder: Path) -> dict:
    texts = synthetic_texts(n)
    tokenizer = train_tokenizer(texts[: min(n, 20_000)], vocab_size=8192)
    options = {"max_length": 128, "data_sha256": "0" * 64, "tokenizer_sha256": "1" * 64, "layout": "bench"}
    timings = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # truncation report
        for step in ("tokenize", "reread"):
            start = time.perf_counter()
            store = tokenize_texts(
                texts, tokenizer, cache_dir=folder, source="synthetic", progress=False, **options
            )
            timings[step] = time.perf_counter() - start
    assert store.from_cache and len(store) == n
    collate_rows = rows_per_second(labelled_store(store, n // 2), batches=200)
    return {
        "texts": n,
        "tokens": store.num_tokens,
        "tokenize_s": round(timings["tokenize"], 3),
        "texts_per_s": round(n / timings["tokenize"]),
        "reread_s": round(timings["reread"], 4),
        "collate_rows_per_s": round(collate_rows),
    }


def labelled_store(tokens: TokenStore, num_pairs: int) -> TextStore:
    """Pairs over the first ``2 * num_pairs`` texts: rows ``2k`` and ``2k + 1`` share label ``k``."""
    rows = 2 * num_pairs
    is_query = np.zeros(rows, bool)
    is_query[0::2] = True
    return TextStore(
        tokens, np.arange(rows), np.arange(rows) // 2, pad_id=0, vocab_size=VOCAB, is_query=is_query
    )


def rows_per_second(store: TextStore, batches: int) -> float:
    sampler = PKBatchSampler(store.labels, BATCH_CLASSES, 2, num_replicas=1, rank=0, seed=0)
    collate = TextCollate(store)
    chosen = [batch for _, batch in zip(range(batches), iter(sampler))]
    collate(chosen[0])  # warm-up
    start = time.perf_counter()
    rows = sum(len(collate(batch)["index"]) for batch in chosen)
    return rows / (time.perf_counter() - start)


def write_synthetic_store(folder: Path, num_pairs: int) -> Path:
    """A store of ``2 * num_pairs`` texts of ``TOKENS_PER_TEXT`` random ids, written chunk by chunk."""
    rng = np.random.default_rng(0)
    directory = folder / "synthetic-tokens"
    chunk = 50_000
    with TokenStoreWriter(directory, {"max_length": TOKENS_PER_TEXT}) as writer:
        for start in range(0, 2 * num_pairs, chunk):
            count = min(chunk, 2 * num_pairs - start)
            ids = rng.integers(5, VOCAB, (count, TOKENS_PER_TEXT), dtype=np.uint32)
            ids[:, 0], ids[:, -1] = 2, 3
            writer.append(ids.reshape(-1), np.full(count, TOKENS_PER_TEXT), rng.integers(0, 2**63, count))
    return directory


def _rss_kib() -> tuple[int, int]:
    """``(anonymous, file-backed)`` resident memory in KiB: mapped token pages count as file-backed."""
    return proc_status_kib("RssAnon") or 0, proc_status_kib("RssFile") or 0


def memory_worker(directory: str, num_pairs: int, batches: int) -> None:
    """In a fresh process: RSS growth (anonymous and file-backed) of opening the store and of collating."""
    before = _rss_kib()
    store = labelled_store(TokenStore(directory), num_pairs)
    opened = _rss_kib()
    collate = TextCollate(store)
    rng = np.random.default_rng(1)
    start = time.perf_counter()
    rows = 0
    for _ in range(batches):
        rows += len(collate(rng.integers(0, len(store), 256))["index"])
    seconds = time.perf_counter() - start
    after = _rss_kib()
    growth = {
        "open_anon_mib": (opened[0] - before[0]) / 1024,
        "open_file_mib": (opened[1] - before[1]) / 1024,
        "collate_anon_mib": (after[0] - opened[0]) / 1024,
        "collate_file_mib": (after[1] - opened[1]) / 1024,
    }
    print(json.dumps({**growth, "rows_per_s": rows / seconds, "rows": rows}))


def measure_memory(num_pairs: int, batches: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        directory = write_synthetic_store(Path(folder), num_pairs)
        write_s = time.perf_counter() - start
        size = sum(f.stat().st_size for f in directory.iterdir())
        worker = run_worker(Path(__file__), "--memory-worker", directory, num_pairs, batches)
    return {
        "pairs": num_pairs,
        "tokens_per_text": TOKENS_PER_TEXT,
        "store_mib": round(size / 2**20, 1),
        "write_s": round(write_s, 2),
        **{key: round(value, 1) for key, value in worker.items() if key.endswith("_mib")},
        "collate_batches": batches,
        "collate_rows_per_s": round(worker["rows_per_s"]),
    }


def table(tokenizing: dict, memory: dict) -> str:
    """The markdown table of both measurements."""
    return markdown_table(
        ["measure", "value"],
        "lr",
        [
            [
                f"tokenize {tokenizing['texts']:,} texts ({tokenizing['tokens']:,} tokens), s",
                tokenizing["tokenize_s"],
            ],
            ["texts / s", f"{tokenizing['texts_per_s']:,}"],
            ["re-read the cache, s", tokenizing["reread_s"]],
            ["collate rows / s (128 x 2 pairs, padded)", f"{tokenizing['collate_rows_per_s']:,}"],
            [
                f"store of {memory['pairs']:,} pairs x {memory['tokens_per_text']} tokens, MiB on disk",
                memory["store_mib"],
            ],
            ["RSS growth, anonymous: open it and build the TextStore, MiB", memory["open_anon_mib"]],
            [
                f"RSS growth, anonymous: collate {memory['collate_batches']} random batches of 256, MiB",
                memory["collate_anon_mib"],
            ],
            [
                "RSS growth, file-backed (mapped token pages): open / collate, MiB",
                f"{memory['open_file_mib']} / {memory['collate_file_mib']}",
            ],
            ["collate rows / s on it (random rows)", f"{memory['collate_rows_per_s']:,}"],
        ],
    )


def main(argv: list[str] | None = None) -> dict:
    args = make_parser(
        __doc__, quick_help="20,000 texts and 20,000 pairs: a smoke test", threads=1
    ).parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        tokenizing = measure_tokenizing(20_000 if args.quick else 200_000, Path(folder))
    memory = measure_memory(20_000 if args.quick else 1_000_000, 50 if args.quick else 400)
    text = table(tokenizing, memory)
    notes = [f"machine: {machine_info()}; load average {load_average()}"]
    print(f"{text}\n\n{notes[0]}")
    result = {"tokenizing": tokenizing, "memory": memory, "machine": machine_info()}
    return write_results(args.out, "text_loader", args.quick, result, text, notes=notes)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--memory-worker":
        memory_worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
