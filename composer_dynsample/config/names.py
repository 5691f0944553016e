"""The short names each config section may use, and the arguments a builder supplies itself.

One table per section (:data:`DATASETS`, :data:`ENCODERS`, :data:`LOSSES`, :data:`SAMPLERS`,
:data:`ALGORITHMS`, :data:`CALLBACKS`, :data:`OPTIMIZERS`, :data:`SCHEDULERS`, :data:`LOGGERS`) maps a
short name to its target, a :class:`~composer_dynsample.config.components.Lazy` import path: nothing is
imported until a section names it. :func:`~composer_dynsample.config.components.resolve_entry` finds a
section's ``name`` or ``_component_`` in them and checks its keys before a builder calls the target.
"""

from __future__ import annotations

from composer_dynsample.config.components import Lazy, Registered

__all__ = [
    "ALGORITHMS",
    "CALLBACKS",
    "DATASETS",
    "ENCODERS",
    "LOADER_OWNED",
    "LOGGERS",
    "LOSSES",
    "MODEL_OWNED",
    "OPTIMIZERS",
    "SAMPLERS",
    "SAMPLER_RESERVED",
    "SCHEDULERS",
]

# What the builder supplies to any sampler, optimizer or data loader target: never a config key.
SAMPLER_RESERVED = ("labels", "num_replicas", "rank")
LOADER_OWNED = ("dataset", "batch_sampler", "batch_size", "shuffle", "sampler", "drop_last", "collate_fn")
MODEL_OWNED = ("encoder", "loss", "train_metrics", "eval_metrics")

_SAMPLER = {"reserved": SAMPLER_RESERVED, "inferred": ("seed",)}
_STORE_ROWS = ("is_passage", "duplicate_ids")  # what a sampler of pairs reads off the text store


def _from(module: str, pairs: str) -> dict[str, Lazy]:
    """Registry entries of one module from ``"short_name=Attribute ..."`` pairs."""
    return {name: Lazy(module, attribute) for name, attribute in (pair.split("=") for pair in pairs.split())}


# Registry targets are imported on first use (Lazy): checking a config imports only what its sections name.
DATASETS: dict[str, Registered | Lazy] = {
    **_from("composer_dynsample.data", "mnist1d=load_mnist1d digits=load_digits file=load_file"),
    "glyphs": Lazy("composer_dynsample.data.glyphs", "load_glyphs"),
    # data.prompt_names: prompts named by the model folder (composer_dynsample.config.prompts).
    "pairs": Lazy("composer_dynsample.data.text.pairs", "load_pairs", extra={"prompt_names": None}),
    "texts": Lazy("composer_dynsample.data.text.texts", "load_texts", extra={"prompt_names": None}),
    "code_search": Lazy(
        "composer_dynsample.data.text.code_search_pairs", "load_code_search", extra={"prompt_names": None}
    ),
    # MDS shards written by `composer-dynsample convert --to mds` (the streaming extra); run_prompts: the
    # model folder's prompts (config/prompts.py, folder_prompts), checked against the shards'.
    "streaming": Lazy("composer_dynsample.data.streaming.load", "load_streaming", reserved=("run_prompts",)),
}
_ENCODERS, _TEXT = "composer_dynsample.models.encoders", "composer_dynsample.models.text"
_TRANSFORMER = "composer_dynsample.models.transformer"
ENCODERS: dict[str, Registered | Lazy] = {
    "conv1d": Lazy(_ENCODERS, "Conv1dEncoder", inferred=("input_length", "in_channels")),
    "mlp": Lazy(_ENCODERS, "MLPEncoder", inferred=("in_features",)),
    "conv2d": Lazy(_ENCODERS, "Conv2dEncoder", inferred=("input_size", "in_channels")),
    "transformer": Lazy(_TRANSFORMER, "TransformerEncoder", inferred=("vocab_size",)),
    "bag_of_tokens": Lazy(_TEXT, "BagOfTokensEncoder", inferred=("vocab_size",)),
    "text_cnn": Lazy(_TEXT, "TextCNNEncoder", inferred=("vocab_size",)),
    # Its towers are model.encoder sections of their own, which the builder builds first.
    "two_tower": Lazy(_TEXT, "TwoTowerEncoder"),
}
# Keys of model.loss that wrap the loss in a MatryoshkaLoss (config/matryoshka.py takes them off first):
# listed so that a misspelt one is matched.
_MATRYOSHKA = {"matryoshka_dims": None, "matryoshka_weights": None}
LOSSES: dict[str, Registered | Lazy] = {
    name: Lazy(entry.module, entry.attribute, extra=_MATRYOSHKA)
    for name, entry in _from(
        "composer_dynsample.losses",
        "triplet_margin=TripletMarginLoss contrastive=ContrastiveLoss multi_similarity=MultiSimilarityLoss "
        "info_nce=InfoNCELoss",
    ).items()
}
SAMPLERS: dict[str, Registered | Lazy] = {
    "pk": Lazy("composer_dynsample.samplers.pk", "PKBatchSampler", **_SAMPLER),
    "two_stream": Lazy(
        "composer_dynsample.samplers.two_stream",
        "TwoStreamBatchSampler",
        reserved=("primary_indices", "secondary_indices", "num_replicas", "rank"),
        inferred=("seed",),
        # The primary stream is a stratified `primary_fraction` of the train split, the secondary the rest.
        extra={"primary_fraction": 0.5},
    ),
    "hard_class_pk": Lazy("composer_dynsample.samplers.hard_class", "HardClassPKBatchSampler", **_SAMPLER),
    "neighbours": Lazy("composer_dynsample.samplers.neighbours", "NeighbourBatchSampler", **_SAMPLER),
    # Pairs data only: which rows are passages and the texts' ids come from the store.
    "mined_negatives": Lazy(
        "composer_dynsample.samplers.mined_negatives",
        "MinedNegativesPKBatchSampler",
        reserved=(*_SAMPLER["reserved"], *_STORE_ROWS),
        inferred=("seed",),
    ),
}
ALGORITHMS: dict[str, Registered | Lazy] = {
    "hard_negative_mining": Lazy(
        "composer_dynsample.algorithms.hard_negative_mining.hard_negative_mining", "HardNegativeMining"
    ),
    "embedding_table": Lazy(
        "composer_dynsample.algorithms.embedding_table.embedding_table", "EmbeddingTable"
    ),
    "batch_augmentation": Lazy("composer_dynsample.algorithms.augmentation", "BatchAugmentation"),
    # Composer's own: Hugging Face's Trainer clips the gradients' norm at max_grad_norm 1.0 by default.
    "gradient_clipping": Lazy("composer.algorithms", "GradientClipping"),
}
CALLBACKS: dict[str, Registered | Lazy] = {
    "set_sampler_epoch": Lazy("composer_dynsample.callbacks.set_sampler_epoch", "SetSamplerEpoch"),
    "progress_lines": Lazy("composer_dynsample.callbacks.progress_lines", "ProgressLines"),
    **_from(
        "composer.callbacks",
        "lr_monitor=LRMonitor speed_monitor=SpeedMonitor optimizer_monitor=OptimizerMonitor",
    ),
}
OPTIMIZERS: dict[str, Registered | Lazy] = {
    name: Lazy("torch.optim", attribute, reserved=("params",))
    for name, attribute in (("adamw", "AdamW"), ("adam", "Adam"), ("sgd", "SGD"))
}
SCHEDULERS: dict[str, Registered | Lazy] = {
    "one_cycle": Lazy("composer_dynsample.schedulers", "OneCycleScheduler"),
    **_from(
        "composer.optim",
        "cosine_with_warmup=CosineAnnealingWithWarmupScheduler linear_with_warmup=LinearWithWarmupScheduler "
        "constant_with_warmup=ConstantWithWarmupScheduler",
    ),
}
LOGGERS: dict[str, Registered | Lazy] = _from(
    "composer.loggers",
    "file=FileLogger in_memory=InMemoryLogger tensorboard=TensorboardLogger wandb=WandBLogger mlflow=MLFlowLogger",
)
