"""What the config tests and the sampler tests that run a text config share."""

from __future__ import annotations


def pairs_config(path, cache, **sections) -> dict:
    """A config dict for a small pairs run on ``path``, its token cache in ``cache``.

    Each keyword in ``sections`` replaces that whole section.
    """
    config = {
        "data": {
            "name": "pairs",
            "path": str(path),
            "vocab_size": 200,
            "max_length": 24,
            "cache_dir": str(cache),
        },
        "model": {"encoder": {"name": "bag_of_tokens", "token_dim": 16}, "loss": {"name": "info_nce"}},
        "sampler": {"name": "pk", "classes_per_batch": 8, "samples_per_class": 2},
        "optimizer": {"name": "adamw", "lr": 0.01},
        "evaluation": {"interval": "1ep", "ks": [1, 5]},
        "trainer": {"max_duration": "2ba", "progress_bar": False},
    }
    config.update(sections)
    return config
