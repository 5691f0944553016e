"""Set-up of every 2-rank test: the directories the test shared between its ranks are removed after it."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture(autouse=True)
def _remove_shared_dirs():
    yield
    helpers = sys.modules.get("tests.distributed._helpers")  # imported by the tests that share a directory
    if helpers is not None:
        helpers.remove_shared_dirs()
