"""Shared helpers for sampler tests: every rank of a world in one process, and mined-negative pair data."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import torch
from hypothesis import HealthCheck, settings

from composer_dynsample.samplers.mined_negatives import CorpusCandidates, MinedNegativesPKBatchSampler
from tests.common import IndexRecorder


def all_ranks(factory: Callable[[int], object], world: int) -> list:
    """One sampler per simulated rank."""
    return [factory(rank) for rank in range(world)]


def all_ranks_or_none(factory: Callable[[int], object], world: int) -> list | None:
    """One sampler per simulated rank, or ``None`` when the sampler refuses the setup with a ``ValueError``.

    Warnings are silenced: property tests draw setups with small classes or few batches on purpose, and
    those warnings have their own tests.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return all_ranks(factory, world)
    except ValueError:
        return None


def assert_same_batches(first: list, second: list, epochs: tuple[int, ...]) -> None:
    """Two samplers per rank, built alike, yield the same batches in every one of ``epochs``."""
    for a, b in zip(first, second, strict=True):
        for epoch in epochs:
            a.set_epoch(epoch)
            b.set_epoch(epoch)
            assert list(a) == list(b)


def assert_disjoint_across_ranks(samplers: list, epoch: int) -> None:
    """No index appears twice within one epoch, on one rank or across ranks."""
    for sampler in samplers:
        sampler.set_epoch(epoch)
    used = np.concatenate([np.asarray(list(s), dtype=np.int64).reshape(-1) for s in samplers])
    assert np.unique(used).size == used.size, "an index appears twice in one epoch"


# ----------------------------------------------------------------- mined negatives of pair data
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def pairs_data(num_pairs: int, seed: int, *, duplicates: bool = False, dim: int = 4):
    """Rows of ``num_pairs`` pairs in a shuffled order, with sparse labels, their passages and text ids.

    With ``duplicates`` some passages share a text, some anchors share a query text, and one passage
    repeats an anchor's text, each with an embedding of its own (the model sees the same text in two
    contexts only in the table's staleness, but the guards must not rely on equal embeddings)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(2 * num_pairs)
    labels = (np.repeat(np.arange(num_pairs), 2) * 5 - 7)[order]
    is_passage = np.tile([False, True], num_pairs)[order]
    texts = np.arange(2 * num_pairs) * 11 + 1000
    if duplicates:
        texts = np.where(is_passage, rng.integers(0, int(1.5 * num_pairs), 2 * num_pairs), texts)
        queries = np.flatnonzero(~is_passage)
        texts[queries[:3]] = texts[queries[3]]  # four pairs of one query
        texts[np.flatnonzero(is_passage)[0]] = texts[queries[5]]  # a passage with an anchor's text
    embeddings = torch.randn(2 * num_pairs, dim, generator=torch.Generator().manual_seed(seed))
    return labels, is_passage, texts, embeddings


def reference(
    embeddings, labels, is_passage, window, skip_top=0, margin=None, texts=None, valid=None, gap=None
):
    """``corpus_candidates`` by brute force: every pair, every passage, sorted in Python (``margin``: the
    relative one, ``gap``: the absolute one)."""
    unit = torch.nn.functional.normalize(embeddings.double(), dim=1)
    n = len(labels)
    texts = np.arange(n) if texts is None else texts
    usable = [
        bool(torch.isfinite(embeddings[i]).all()) and bool(embeddings[i].abs().sum() > 0) for i in range(n)
    ]
    usable = [u and (valid is None or bool(valid[i])) for i, u in enumerate(usable)]
    classes = sorted(set(labels.tolist()))
    anchor = {c: next(i for i in range(n) if labels[i] == c and not is_passage[i]) for c in classes}
    positive = {c: next(i for i in range(n) if labels[i] == c and is_passage[i]) for c in classes}
    width = skip_top + window
    ranked, kept, dropped, searched, similarity, positives = [], [], [], [], [], []
    for c in classes:
        a, p = anchor[c], positive[c]
        ok = usable[a] and (usable[p] or (margin is None and gap is None))
        searched.append(ok)
        own = float(unit[a] @ unit[p]) if ok and usable[p] else float("nan")
        positives.append(own)
        sims = {q: float(unit[a] @ unit[q]) for q in positive.values() if q != p and usable[q]}
        order = sorted(sims, key=lambda q: (-sims[q], q)) if ok else []
        row = (order[:width] + [-1] * width)[:width]
        similarity.append([sims[q] if q >= 0 else -np.inf for q in row])
        keep, counts = [False] * width, [sum(q >= 0 for q in row[:skip_top]), 0, 0, 0]
        for i in range(skip_top, width):
            q = row[i]
            if q < 0:
                continue
            if texts[q] in (texts[a], texts[p]):
                counts[1] += 1
            elif texts[anchor[labels[q]]] == texts[a]:
                counts[2] += 1
            elif (margin is not None and sims[q] > margin * own) or (gap is not None and sims[q] + gap > own):
                counts[3] += 1
            else:
                keep[i] = True
        ranked.append(row), kept.append(keep), dropped.append(counts)
    return CorpusCandidates(
        np.array(ranked),
        np.array(kept),
        np.array(dropped),
        np.array(searched),
        np.array(similarity, dtype=np.float64).reshape(len(classes), width),
        np.array(positives),
    )


def sampler_for(labels, is_passage, texts, p, n, **options):
    return MinedNegativesPKBatchSampler(labels, p, n, is_passage=is_passage, duplicate_ids=texts, **options)


def check_guards(batches, labels, is_passage, texts, p, n, expected):
    """Every negative: a passage of another pair, a text new to the batch, never a dropped candidate;
    a random negative only when each of the anchor's kept candidates has its text in the batch."""
    classes = np.unique(labels)
    pair_of = np.searchsorted(classes, labels)
    anchor_of_pair = np.empty(classes.size, dtype=np.int64)
    anchor_of_pair[pair_of[~is_passage]] = np.flatnonzero(~is_passage)
    for batch in batches:
        pairs, negatives = batch[: 2 * p], batch[2 * p :].reshape(p, n)
        assert is_passage[negatives].all()
        all_texts = texts[batch]
        assert np.unique(texts[negatives]).size == negatives.size
        assert not set(texts[negatives.ravel()].tolist()) & set(texts[pairs].tolist())
        anchors = pairs[~is_passage[pairs]]
        for anchor, own in zip(anchors, negatives):
            assert not set(pair_of[own].tolist()) & set(pair_of[pairs].tolist())  # no pair of the batch
            assert (
                texts[anchor_of_pair[pair_of[own]]] != texts[anchor]
            ).all()  # no other answer of its query
            if expected is None:
                continue
            k = pair_of[anchor]
            ranked, kept = expected.ranked[k], expected.kept[k]
            assert not set(own.tolist()) & set(ranked[~kept & (ranked >= 0)].tolist())  # window and guards
            survivors = set(ranked[kept].tolist())
            if not set(own.tolist()) <= survivors:
                assert set(texts[list(survivors)].tolist()) <= set(all_texts.tolist())


def check_guards_on_snapshot(
    batches, labels, is_passage, texts, embeddings, p, n, *, window, skip_top, margin
):
    """:func:`check_guards` with the brute-force :func:`reference` of the snapshot ``embeddings`` expected."""
    expected = reference(embeddings, labels, is_passage, window, skip_top, margin, texts)
    check_guards(batches, labels, is_passage, texts, p, n, expected)


def make_run(num_workers=0, refresh_in_background=False, stage_writes=None, table_options=None, **kwargs):
    """48 pairs, 4 pairs x (2 + 2 negatives) a batch, 12 batches an epoch, a refresh every 3 batches; the
    table gets ``table_options``."""
    from composer import Trainer
    from composer.core import Callback

    from composer_dynsample import EmbeddingModel, HardNegativeMining, SetSamplerEpoch, build_dataloader
    from composer_dynsample.algorithms.embedding_table import EmbeddingTable
    from composer_dynsample.data import GatherCollate, IndexDataset, TensorStore

    gen = torch.Generator().manual_seed(0)
    pairs = (torch.randn(8, 6, generator=gen) * 2)[torch.arange(48) % 8] + torch.randn(48, 6, generator=gen)
    data = TensorStore(
        pairs.repeat_interleave(2, 0) + 0.3 * torch.randn(96, 6, generator=gen), torch.arange(96) // 2
    )
    sampler = MinedNegativesPKBatchSampler(
        data.labels,
        4,
        2,
        is_passage=torch.arange(96) % 2 == 1,
        window=4,
        max_relative_similarity=None,
        refresh_every=3,
        refresh_in_background=refresh_in_background,
        seed=3,
    )
    table = EmbeddingTable(stage_writes=stage_writes, **(table_options or {}))
    searched_at = []

    class WhenSearched(Callback):
        """The table's newest stamp each time the sampler reads it: the step it searched."""

        def fit_start(self, state, logger) -> None:
            source = sampler.snapshot_source

            def spy():
                searched_at.append(-1 if table.written_at is None else int(table.written_at.max()))
                return source()

            sampler.snapshot_source = spy

    torch.manual_seed(0)
    model = EmbeddingModel(torch.nn.Linear(6, 4))
    recorder = IndexRecorder()
    options = {"num_workers": num_workers, "prefetch_factor": 2} if num_workers else {}
    loader = build_dataloader(IndexDataset(data.labels), sampler, collate_fn=GatherCollate(data), **options)
    trainer = Trainer(
        model=model,
        train_dataloader=loader,
        optimizers=torch.optim.SGD(model.parameters(), lr=0.05),
        algorithms=[HardNegativeMining("semi_hard"), table],
        callbacks=[recorder, SetSamplerEpoch(), WhenSearched()],
        max_duration="3ep",
        progress_bar=False,
        seed=0,
        **kwargs,
    )
    return trainer, sampler, recorder, searched_at, table
