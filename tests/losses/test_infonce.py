"""InfoNCELoss against pytorch-metric-learning's NTXentLoss and a brute-force reference."""

from __future__ import annotations

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses

from composer_dynsample import InfoNCELoss
from composer_dynsample.losses import all_pairs
from composer_dynsample.mining import BatchHardMiner, HardTopKMiner, MultiSimilarityMiner, SemiHardMiner
from tests.algorithms.helpers import reference_duplicates


def _batch(seed: int, size: int = 12, dim: int = 5, classes: int = 3, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    embeddings = torch.nn.functional.normalize(torch.randn(size, dim, generator=generator), dim=1)
    labels = torch.randint(0, classes, (size,), generator=generator)
    return embeddings.to(dtype), labels


def _pool(seed: int, size: int = 9, dim: int = 5, classes: int = 3):
    return _batch(seed + 1000, size=size, dim=dim, classes=classes)


def reference(embeddings, labels, tuples=None, ref=None, ref_labels=None, *, temperature=0.07,
              negatives="pool", symmetric=False, distance="cosine", duplicates=None):  # fmt: skip
    """The definition, one positive pair at a time, with Python sets, in float64; ``duplicates[a][n]``
    (a list of lists) takes ``(a, n)`` out of the negatives."""
    pool = embeddings if ref is None else ref
    pool_labels = labels if ref_labels is None else ref_labels
    x, y = embeddings.double(), pool.double()
    if distance == "cosine":
        similarity = torch.nn.functional.normalize(x, dim=1) @ torch.nn.functional.normalize(y, dim=1).T
    else:
        similarity = -(torch.cdist(x, y) ** (2 if distance == "squared_euclidean" else 1))
    logits = similarity / temperature
    rows, cols = range(len(labels)), range(len(pool_labels))
    other = {(a, n) for a in rows for n in cols if labels[a] != pool_labels[n]}
    if tuples is None:
        positive = {
            (a, p) for a in rows for p in cols if labels[a] == pool_labels[p] and (ref is not None or a != p)
        }
        negative = other
    else:
        a1, p, a2, n = tuples if len(tuples) == 4 else (tuples[0], tuples[1], tuples[0], tuples[2])
        positive = set(zip(a1.tolist(), p.tolist()))
        negative = other if negatives == "pool" else set(zip(a2.tolist(), n.tolist()))
    if duplicates is not None:
        negative = {(a, n) for a, n in negative if not duplicates[a][n]}
    losses = []
    for a, p in sorted(positive):
        forward = [logits[a, p]] + [logits[a, n] for n in cols if (a, n) in negative]
        loss = torch.logsumexp(torch.stack(forward), 0) - logits[a, p]
        if symmetric:
            reverse = [logits[a, p]] + [logits[b, p] for b in rows if (b, p) in negative]
            loss = (loss + torch.logsumexp(torch.stack(reverse), 0) - logits[a, p]) / 2
        losses.append(loss)
    return torch.stack(losses).mean() if losses else torch.zeros((), dtype=torch.float64)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("temperature", [0.07, 0.5])
@pytest.mark.parametrize("with_pool", [False, True])
def test_defaults_equal_pml_ntxent_on_embeddings_and_labels(seed, temperature, with_pool):
    embeddings, labels = _batch(seed)
    ref, ref_labels = _pool(seed) if with_pool else (None, None)
    ours = InfoNCELoss(temperature)(embeddings, labels, None, ref, ref_labels)
    theirs = pml_losses.NTXentLoss(temperature=temperature)(embeddings, labels, None, ref, ref_labels)
    assert torch.allclose(ours, theirs, atol=1e-9), (ours, theirs)
    assert ours > 0


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("miner", ["batch_hard", "multi_similarity"])
@pytest.mark.parametrize("with_pool", [False, True])
def test_mined_negatives_equal_pml_ntxent_on_the_same_tuples(seed, miner, with_pool):
    embeddings, labels = _batch(seed, size=16)
    ref, ref_labels = _pool(seed, size=12) if with_pool else (None, None)
    mine = BatchHardMiner() if miner == "batch_hard" else MultiSimilarityMiner(epsilon=0.3)
    tuples = mine(embeddings, labels, ref, ref_labels)  # neither repeats a pair
    assert tuples[0].numel() > 0
    ours = InfoNCELoss(0.1, negatives="mined")(embeddings, labels, tuples, ref, ref_labels)
    theirs = pml_losses.NTXentLoss(temperature=0.1)(embeddings, labels, tuples, ref, ref_labels)
    assert torch.allclose(ours, theirs, atol=1e-9), (ours, theirs)
    # negatives="pool" keeps the tuple's positives and takes every other-label row: PML given all of them.
    a1, p = (tuples[0], tuples[1])
    _, _, a2, n = all_pairs(labels, ref_labels)
    ours = InfoNCELoss(0.1)(embeddings, labels, tuples, ref, ref_labels)
    theirs = pml_losses.NTXentLoss(temperature=0.1)(embeddings, labels, (a1, p, a2, n), ref, ref_labels)
    assert torch.allclose(ours, theirs, atol=1e-9), (ours, theirs)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("negatives", ["pool", "mined"])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("distance", ["cosine", "euclidean", "squared_euclidean"])
def test_equals_the_brute_force_definition_with_repeated_tuples(seed, negatives, symmetric, distance):
    embeddings, labels = _batch(seed, size=16)
    ref, ref_labels = _pool(seed, size=10)
    # semi_hard repeats negatives across an anchor's positives and hard_topk repeats positives.
    cases = [
        (SemiHardMiner(margin=0.5)(embeddings, labels, ref, ref_labels), ref, ref_labels),
        (HardTopKMiner(k=3)(embeddings, labels), None, None),
        (None, ref, ref_labels),
        (None, None, None),
    ]
    (a, _, n), (b, q, _) = cases[0][0], cases[1][0]
    assert (
        len(set(zip(a.tolist(), n.tolist()))) < a.numel()
        and len(set(zip(b.tolist(), q.tolist()))) < b.numel()
    )
    loss = InfoNCELoss(0.2, negatives=negatives, symmetric=symmetric, distance=distance)
    for tuples, pool, pool_labels in cases:
        ours = loss(embeddings, labels, tuples, pool, pool_labels)
        expected = reference(embeddings, labels, tuples, pool, pool_labels, temperature=0.2,
                             negatives=negatives, symmetric=symmetric, distance=distance)  # fmt: skip
        assert torch.allclose(ours, expected, atol=1e-9), (ours, expected)


def test_repeated_pairs_count_once_where_pml_counts_them_again():
    embeddings, labels = _batch(0, size=8, classes=2)
    anchors, positives = all_pairs(labels)[:2]
    first_negative = torch.stack([(labels != label).nonzero()[0, 0] for label in labels])
    tuples = (anchors, positives, torch.arange(8), first_negative)  # pairs, none repeated
    doubled = tuple(torch.cat([t, t]) for t in tuples)
    loss = InfoNCELoss(0.1, negatives="mined")
    assert torch.allclose(loss(embeddings, labels, doubled), loss(embeddings, labels, tuples), atol=1e-12)
    pml = pml_losses.NTXentLoss(temperature=0.1)
    assert torch.allclose(pml(embeddings, labels, tuples), loss(embeddings, labels, tuples), atol=1e-9)
    assert not torch.allclose(pml(embeddings, labels, doubled), loss(embeddings, labels, tuples), atol=1e-3)


def test_symmetric_is_the_forward_loss_when_the_batch_is_its_own_pool():
    embeddings, labels = _batch(3)
    assert torch.allclose(InfoNCELoss(symmetric=True)(embeddings, labels), InfoNCELoss()(embeddings, labels))
    ref, ref_labels = _pool(3)
    forward = InfoNCELoss()(embeddings, labels, None, ref, ref_labels)
    assert not torch.allclose(InfoNCELoss(symmetric=True)(embeddings, labels, None, ref, ref_labels), forward)


@pytest.mark.parametrize("negatives", ["pool", "mined"])
@pytest.mark.parametrize("symmetric", [False, True])
def test_gradients_match_finite_differences(negatives, symmetric):
    embeddings, labels = _batch(5, size=6, dim=3)
    ref, ref_labels = _pool(5, size=5, dim=3)
    embeddings.requires_grad_(True)
    ref.requires_grad_(True)
    tuples = SemiHardMiner(margin=1.0)(embeddings.detach(), labels, ref.detach(), ref_labels)
    assert tuples[0].numel() > 0
    loss = InfoNCELoss(0.3, negatives=negatives, symmetric=symmetric)
    assert torch.autograd.gradcheck(
        lambda e, r: loss(e, labels, tuples, r, ref_labels), (embeddings, ref), eps=1e-6, atol=1e-6
    )
    assert torch.autograd.gradcheck(lambda e: loss(e, labels), (embeddings,), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_are_computed_in_float32(dtype):
    embeddings, labels = _batch(7, size=32, dim=16, classes=6, dtype=dtype)
    embeddings.requires_grad_(True)
    loss = InfoNCELoss(0.05, symmetric=True)
    value = loss(embeddings, labels)
    assert value.dtype == torch.float32
    assert torch.allclose(value, loss(embeddings.detach().float(), labels), atol=1e-6)
    expected = reference(embeddings.detach(), labels, temperature=0.05, symmetric=True)
    assert torch.allclose(value.double(), expected, rtol=1e-5)
    value.backward()
    assert embeddings.grad.dtype == dtype and torch.isfinite(embeddings.grad).all()
    assert embeddings.grad.abs().sum() > 0


@pytest.mark.parametrize("temperature", [1e-3, 1e-4])
def test_small_temperatures_stay_finite_and_exact(temperature):
    embeddings, labels = _batch(11, size=24, classes=4, dtype=torch.float32)
    embeddings.requires_grad_(True)
    value = InfoNCELoss(temperature, symmetric=True)(embeddings, labels)
    expected = reference(embeddings.detach(), labels, temperature=temperature, symmetric=True)
    assert torch.isfinite(value) and torch.allclose(value.double(), expected, rtol=1e-4)
    value.backward()
    assert torch.isfinite(embeddings.grad).all()


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("global_mean", [False, True])
@pytest.mark.parametrize(
    ("labels", "ref_labels"),
    [([0, 1, 2, 3], [4, 5, 6, 7]), ([1, 1, 1, 1], [1, 1, 1, 1])],
    ids=["no-positive", "no-negative"],
)
def test_nothing_to_contrast_gives_an_attached_zero(symmetric, global_mean, labels, ref_labels):
    embeddings, _ = _batch(2, size=4)
    ref, _ = _pool(2, size=4)
    embeddings.requires_grad_(True)
    ref.requires_grad_(True)
    labels, ref_labels = torch.tensor(labels), torch.tensor(ref_labels)
    loss = InfoNCELoss(symmetric=symmetric)
    value = loss(embeddings, labels, None, ref, ref_labels, global_mean=global_mean)
    value.backward()
    assert value == 0
    for leaf in (embeddings, ref):
        assert leaf.grad is not None and torch.equal(leaf.grad, torch.zeros_like(leaf))


def test_global_mean_on_one_process_is_the_plain_mean():
    embeddings, labels = _batch(4)
    ref, ref_labels = _pool(4)
    tuples = BatchHardMiner()(embeddings, labels, ref, ref_labels)
    loss = InfoNCELoss(symmetric=True)
    plain = loss(embeddings, labels, tuples, ref, ref_labels)
    assert torch.allclose(loss(embeddings, labels, tuples, ref, ref_labels, global_mean=True), plain)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": 0.0}, "temperature must be a number > 0.0"),
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"negatives": "hard"}, "negatives must be one of ('pool', 'mined', 'passages')"),
        ({"symmetric": 1}, "symmetric must be true or false"),
        ({"distance": "manhattan"}, "distance must be one of"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        InfoNCELoss(**kwargs)


def test_bad_inputs_are_named():
    embeddings, labels = _batch(0, size=6)
    ref, ref_labels = _pool(0, size=4)
    loss = InfoNCELoss()
    with pytest.raises(ValueError, match="ref_emb and ref_labels must be given together"):
        loss(embeddings, labels, None, ref)
    with pytest.raises(ValueError, match="labels has 5 entries but embeddings has 6 rows"):
        loss(embeddings, labels[:5])
    with pytest.raises(ValueError, match="ref_emb has dimension 3 but embeddings 5"):
        loss(embeddings, labels, None, ref[:, :3], ref_labels)
    with pytest.raises(TypeError, match="embeddings must be a 2-D floating-point tensor"):
        loss(labels, labels)
    with pytest.raises(ValueError, match="got 2 tensors"):
        loss(embeddings, labels, (labels, labels))
    with pytest.raises(ValueError, match="positive pairs have 2 anchors but 1 partners"):
        loss(embeddings, labels, (torch.tensor([0, 1]), torch.tensor([1]), torch.tensor([2, 2])))
    with pytest.raises(TypeError, match="indices_tuple's n must be a 1-D integer tensor"):
        loss(embeddings, labels, (labels, labels, labels, embeddings[:, 0]))
    with pytest.raises(ValueError, match="needs the pool every rank shares as ref_emb"):
        InfoNCELoss(symmetric=True)(embeddings, labels, global_mean=True)


def test_the_yaml_name_builds_the_loss():
    from omegaconf import OmegaConf

    from composer_dynsample.config.components import lookup
    from composer_dynsample.config.model_builders import build_loss
    from composer_dynsample.config.names import LOSSES

    assert lookup("LOSSES", "info_nce", LOSSES).target is InfoNCELoss
    cfg = OmegaConf.create(
        {"model": {"loss": {"name": "info_nce", "temperature": 0.1, "negatives": "mined"}}}
    )
    loss = build_loss(cfg)
    assert isinstance(loss, InfoNCELoss) and loss.temperature == 0.1 and loss.negatives == "mined"


# Duplicate ids: a row repeating the anchor's sample (or one of its positives') under another label is
# no negative of it.


def _ids(seed: int, size: int, texts: int = 6) -> torch.Tensor:
    """Few distinct ids, so that equal ids under different labels are common; ``-1`` is no id."""
    return torch.randint(-1, texts, (size,), generator=torch.Generator().manual_seed(seed + 500))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("negatives", ["pool", "mined"])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("case", ["batch", "pool", "mined-batch", "mined-pool"])
def test_duplicate_ids_mask_equals_the_brute_force_definition(seed, negatives, symmetric, case):
    embeddings, labels = _batch(seed, size=16)
    ids = _ids(seed, 16)
    ref, ref_labels, ref_ids = (None, None, None)
    if case.endswith("pool"):
        (ref, ref_labels), ref_ids = _pool(seed, size=10), _ids(seed + 1, 10)
    tuples = (
        SemiHardMiner(margin=0.5)(embeddings, labels, ref, ref_labels) if case.startswith("mined") else None
    )
    duplicates = reference_duplicates(labels, ids, *(() if ref is None else (ref_labels, ref_ids)))
    assert any(map(any, duplicates))  # the batch does hold duplicates under other labels
    loss = InfoNCELoss(0.2, negatives=negatives, symmetric=symmetric)
    ours = loss(embeddings, labels, tuples, ref, ref_labels, duplicate_ids=ids, ref_duplicate_ids=ref_ids)
    expected = reference(embeddings, labels, tuples, ref, ref_labels, temperature=0.2, negatives=negatives,
                         symmetric=symmetric, duplicates=duplicates)  # fmt: skip
    assert torch.allclose(ours, expected, atol=1e-9), (ours, expected)
    assert not torch.allclose(ours, loss(embeddings, labels, tuples, ref, ref_labels), atol=1e-6)


def test_without_duplicates_the_ids_change_nothing():
    embeddings, labels = _batch(1, size=12)
    ref, ref_labels = _pool(1, size=8)
    loss = InfoNCELoss(0.1, symmetric=True)
    plain = loss(embeddings, labels, None, ref, ref_labels)
    for ids, ref_ids in (
        (torch.arange(12), torch.arange(12, 20)),
        (torch.full((12,), -1), torch.full((8,), -1)),
    ):
        with_ids = loss(
            embeddings, labels, None, ref, ref_labels, duplicate_ids=ids, ref_duplicate_ids=ref_ids
        )
        assert torch.equal(with_ids, plain)


def test_a_copy_of_the_positive_under_another_label_no_longer_costs_log_two():
    # Pairs (q1, P) and (q2, P): P's copy has exactly the positive's similarity, so unmasked, the anchor
    # q1 cannot do better than log 2 however well it matches P.
    e1, e2 = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    embeddings, labels = torch.stack([e1, e1, e2, e1]), torch.tensor([0, 0, 1, 1])
    ids = torch.tensor([11, 20, 12, 20])  # q1 P q2 P
    tuples = (torch.tensor([0]), torch.tensor([1]), torch.tensor([2]))  # the pair (q1, P) only
    unmasked = InfoNCELoss(0.1)(embeddings, labels, tuples)
    masked = InfoNCELoss(0.1)(embeddings, labels, tuples, duplicate_ids=ids)
    assert torch.allclose(unmasked, torch.log(torch.tensor(2.0)), atol=1e-4)
    assert masked < 1e-4


def test_bad_duplicate_ids_are_named():
    embeddings, labels = _batch(0, size=6)
    ref, ref_labels = _pool(0, size=4)
    ids, loss = torch.arange(6), InfoNCELoss()
    with pytest.raises(ValueError, match="ref_duplicate_ids was given without duplicate_ids"):
        loss(embeddings, labels, ref_duplicate_ids=ids)
    with pytest.raises(ValueError, match="ref_duplicate_ids was given without ref_emb"):
        loss(embeddings, labels, duplicate_ids=ids, ref_duplicate_ids=ids)
    with pytest.raises(ValueError, match="duplicate_ids with ref_emb needs ref_duplicate_ids"):
        loss(embeddings, labels, None, ref, ref_labels, duplicate_ids=ids)
    with pytest.raises(ValueError, match="duplicate_ids has 5 entries but labels has 6 rows"):
        loss(embeddings, labels, duplicate_ids=ids[:5])
    with pytest.raises(TypeError, match="ref_duplicate_ids must be a 1-D integer tensor"):
        loss(embeddings, labels, None, ref, ref_labels, duplicate_ids=ids, ref_duplicate_ids=ref[:, 0])


def test_a_misspelt_keyword_names_the_loss_and_the_close_keyword():
    embeddings = torch.nn.functional.normalize(torch.randn(4, 3, generator=torch.Generator().manual_seed(0)))
    with pytest.raises(TypeError) as caught:
        InfoNCELoss()(embeddings, torch.tensor([0, 0, 1, 1]), duplicate_id=torch.arange(4))
    assert str(caught.value) == (
        "InfoNCELoss.forward() got an unexpected keyword argument 'duplicate_id'. Did you mean 'duplicate_ids'?"
    )
