"""Shared pytest set-up: the world_size(N) marker, as in Composer's own suite.

A test marked ``world_size(N)`` runs only when the launcher provides exactly N ranks (``WORLD_SIZE``);
unmarked tests run only on a single process. Multi-rank tests are launched as
``python -m composer.cli.launcher -n 2 --master_port PORT -m pytest -m world_size tests``.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run and every machine, so that a run's result is the
# code's; HYPOTHESIS_PROFILE=explore draws new ones (a search for counterexamples, not a gate).
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

# The shared helpers assert too: pytest rewrites their asserts as a test module's, for the same reports.
pytest.register_assert_rewrite("tests.common", "tests.cli.helpers", "tests.mining", "tests.samplers.helpers")


def _marked_world_size(item: pytest.Item) -> int:
    marker = item.get_closest_marker("world_size")
    return int(marker.args[0]) if marker is not None else 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    selected, deselected = [], []
    for item in items:
        (selected if _marked_world_size(item) == world_size else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


@pytest.fixture
def transformers_log():
    """What ``transformers`` logs during a test: its own handler may hold a stream captured earlier."""
    import io
    import logging

    from transformers.utils import logging as transformers_logging

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    transformers_logging.add_handler(handler)
    yield stream
    transformers_logging.remove_handler(handler)
