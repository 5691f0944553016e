"""The epoch plan of :class:`~composer_dynsample.samplers.HardClassPKBatchSampler`: every batch's classes.

:func:`_plan_classes` decides, batch after batch, which classes fill each batch and which of their chunks
(P x K's chunks of ``samples_per_class`` samples) they contribute: the classes due (whose chunks left equal
the batches left), random seeds drawn from a shuffled pool of chunk tokens (:class:`_TokenPool`), then each
seed's nearest classes by centroid. :class:`_Plan` holds the state of the epoch being planned. The sampler
turns the plan into sample indices.
"""

from __future__ import annotations

import numpy as np


def _plan_classes(
    left: np.ndarray, n: int, p: int, num_seeds: int, neighbours: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """The classes of every batch and which of its chunks each contributes: two ``(n * P,)`` arrays.

    ``left`` holds each class's chunks this epoch (``n * P`` in all, none above ``n``). Batch ``b`` takes,
    in this order: every class whose chunks left equal the batches left (it must be in every batch from
    here on, so the epoch completes), seeds from a shuffled pool of chunk tokens until it has
    ``num_seeds`` classes, then for each seed in turn the first class of its ``neighbours`` row that is
    not in the batch and has a chunk left (the next token of the pool when none has). A class is due in
    batch ``n - left``: a bucket per batch finds those without a scan of all classes, so a batch costs
    O(P x neighbours) however many classes there are.
    """
    plan = _Plan(left, n, p, rng)
    for b in range(n):
        for c in plan.due[b]:
            if plan.counts[c] == n - b and not plan.in_batch[c]:  # still due (buckets keep stale entries)
                plan.add(c)
        while len(plan.members) < num_seeds:
            plan.add(plan.pool.draw(plan.in_batch))
        seeds, turn = list(plan.members), 0
        while len(plan.members) < p:
            row = neighbours[seeds[turn % len(seeds)]].tolist()
            turn += 1
            choice = next((c for c in row if plan.counts[c] > 0 and not plan.in_batch[c]), -1)
            plan.add(choice if choice >= 0 else plan.pool.draw(plan.in_batch))
        plan.end_batch()
    return plan.classes, plan.chunk_in_class


class _Plan:
    """The state of a hard-class epoch being planned: chunks left and used per class, the batch so far."""

    def __init__(self, left: np.ndarray, n: int, p: int, rng: np.random.Generator) -> None:
        self.n, self.slot = n, 0
        self.counts = left.tolist()
        self.pool = _TokenPool(rng.permutation(np.repeat(np.arange(left.size), left)).tolist(), self.counts)
        self.due: list[list[int]] = [[] for _ in range(n + 1)]
        for c in np.flatnonzero(left).tolist():
            self.due[n - self.counts[c]].append(c)
        self.used = [0] * left.size
        self.in_batch = [False] * left.size
        self.members: list[int] = []
        self.classes = np.empty(n * p, dtype=np.int64)
        self.chunk_in_class = np.empty(n * p, dtype=np.int64)

    def add(self, c: int) -> None:
        """Put the next chunk of class ``c`` into the batch."""
        self.classes[self.slot], self.chunk_in_class[self.slot] = c, self.used[c]
        self.slot += 1
        self.members.append(c)
        self.in_batch[c] = True
        self.used[c] += 1
        self.counts[c] -= 1
        if self.counts[c]:
            self.due[self.n - self.counts[c]].append(c)

    def end_batch(self) -> None:
        for c in self.members:
            self.in_batch[c] = False
        self.members = []
        self.pool.end_batch()


class _TokenPool:
    """A shuffled token per chunk, drawn in order: the random classes of a hard-class epoch.

    A class taken otherwise (forced, or as a seed's neighbour) leaves a surplus token, skipped when drawn
    (a class's tokens still to come never fall below its chunks left), and a token of a class already in
    the batch waits for the next batch. Every token is drawn once, so an epoch costs O(chunks).
    """

    def __init__(self, tokens: list[int], counts: list[int]) -> None:
        self.tokens, self.position, self.counts = tokens, 0, counts
        self.ahead = list(counts)  # tokens of each class not drawn yet (waiting ones included)
        self.waiting: list[int] = []
        self.retry: list[int] = []

    def draw(self, in_batch: list[bool]) -> int:
        """The next class not in the batch with a chunk left; the caller takes one of its chunks."""
        while True:
            if self.retry:
                c = self.retry.pop()
            elif self.position < len(self.tokens):
                c, self.position = self.tokens[self.position], self.position + 1
            else:
                raise RuntimeError("hard-class plan ran out of chunks: the chunk counts were inconsistent.")
            if self.ahead[c] > self.counts[c]:  # a surplus token: its chunk was taken otherwise
                self.ahead[c] -= 1
            elif in_batch[c]:
                self.waiting.append(c)
            else:
                self.ahead[c] -= 1
                return c

    def end_batch(self) -> None:
        """Tokens that waited for this batch to end come first in the next, in the order drawn."""
        self.retry = self.retry + self.waiting[::-1]
        self.waiting = []
