"""Build a Composer ``Trainer`` for metric learning from a YAML config (torchtune style).

A config is a YAML mapping of sections. A section that picks a class names it with ``name:`` from a
small registry or with ``_component_:`` and a dotted import path (``my_models.MyEncoder``,
``pytorch_metric_learning.losses.ArcFaceLoss``), and its other keys are that class's keyword
arguments, one to one; sections whose entries are a set (``algorithms``, ``callbacks``, ``loggers``)
map registry names (or labels of entries with a ``_component_``) to keyword arguments (``{}`` for the
defaults; ``null`` or absent turns the entry off). Every key is checked against ``inspect.signature``
of its target, names and types, so a typo fails early with the key, the valid ones and the closest::

    seed: 0
    run_dir: runs/mnist1d_default          # optional; --run-dir overrides it
    data: {name: mnist1d}                  # DATASETS: load_mnist1d(**kwargs), load_digits, load_file
    model:                                 # EmbeddingModel(encoder, loss, **kwargs)
      normalize: true
      encoder: {name: conv1d, channels: 64, embedding_dim: 64}   # ENCODERS
      loss: {name: triplet_margin, margin: 0.2}                  # LOSSES (+ matryoshka_dims: .matryoshka)
    sampler: {name: pk, classes_per_batch: 16, samples_per_class: 8}   # SAMPLERS
    dataloader: {num_workers: 0}           # DataloaderConfig: DataLoader arguments of the train loader
    algorithms: {hard_negative_mining: {strategy: semi_hard}}   # ALGORITHMS
    callbacks: {set_sampler_epoch: {}}     # CALLBACKS
    optimizer: {name: adamw, lr: 0.003}    # OPTIMIZERS (the lr is the peak lr of a schedule)
    scheduler: {name: one_cycle, pct_start: 0.25}   # SCHEDULERS, or null
    evaluation: {interval: 10ep, ks: [1, 5]}        # EvaluationConfig
    trainer: {max_duration: 60ep}          # any composer.Trainer argument the builder does not own
    loggers: {}                            # LOGGERS

Arguments that come from elsewhere are filled in by the builder and are not valid keys: the labels
of a sampler, ``num_replicas`` and ``rank`` (from the launcher), the optimizer's ``params``. Arguments
that can be read off the data are inferred unless given: ``input_length`` and ``in_channels`` of
``conv1d``, ``in_features`` of ``mlp``, and a sampler's ``seed`` (the top-level ``seed``).

The package has one module per step: :mod:`~composer_dynsample.config.components` (how a section names
its target: ``name`` or ``_component_``, key and type checks), :mod:`~composer_dynsample.config.names`
(the short names each section may use), :mod:`~composer_dynsample.config.loading` (:func:`load_config`
reads a file and dotted overrides such as ``trainer.max_duration=2ep`` with OmegaConf; the structured
configs of the fixed-key sections, defined in :mod:`~composer_dynsample.config.section_schemas`;
:mod:`~composer_dynsample.config.overrides` notes the keys a mapping override leaves out), :mod:`~composer_dynsample.config.checks` (:func:`check_config`
checks every section before anything is built, with :mod:`~composer_dynsample.config.model_checks` and
:mod:`~composer_dynsample.config.signatures`), :mod:`~composer_dynsample.config.builders`,
:mod:`~composer_dynsample.config.model_builders` and :mod:`~composer_dynsample.config.evaluation` (one
builder per section) and :mod:`~composer_dynsample.config.run` (:func:`build_run` turns a config into a
ready :class:`TrainingRun`); ``composer-dynsample train`` runs it. Problems raise :class:`ConfigError`, a
``ValueError`` whose message names the key, the value and what is valid.

Reading and checking a config imports neither Composer nor, until a section's target needs it, torch:
the builders, which import both, are imported with :func:`build_run` on first use (PEP 562).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from composer_dynsample._lazy import lazy_exports

__all__ = ["ConfigError", "TrainingRun", "build_run", "check_config", "load_config", "save_config"]

if TYPE_CHECKING:
    from composer_dynsample.config.checks import check_config
    from composer_dynsample.config.components import ConfigError
    from composer_dynsample.config.loading import load_config, save_config
    from composer_dynsample.config.run import TrainingRun, build_run

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "composer_dynsample.config.components": "ConfigError",
        "composer_dynsample.config.checks": "check_config",
        "composer_dynsample.config.loading": "load_config save_config",
        "composer_dynsample.config.run": "TrainingRun build_run",
    },
    globals(),
)
