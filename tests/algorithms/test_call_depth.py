"""How far ``HardNegativeMining.apply`` is from the miner's kernel: the deepest chain of the package's own frames
under it during one ``AFTER_FORWARD`` of docs/examples/own_composer_model.py (semi_hard), traced with
``sys.setprofile``. Composer's algorithms reach their function in a couple of calls; here each call of the chain
is one a reader can name the reason for (the algorithm, the step, the miner's shared checks, its own mining,
the chunks of anchors, the negatives of a chunk, the successors of the thresholds, their count)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from composer.core import Event

import composer_dynsample
from composer_dynsample.algorithms.hard_negative_mining.hard_negative_mining import HardNegativeMining

PACKAGE = str(Path(composer_dynsample.__file__).parent)
EXAMPLE = Path(__file__).parents[2] / "docs" / "examples" / "own_composer_model.py"


def trace_first_mining(monkeypatch) -> tuple[list[str], set[str]]:
    """The deepest chain of package frames under ``apply`` (``apply`` itself left out) and the modules run."""
    deepest: list[str] = []
    modules: set[str] = set()
    original = HardNegativeMining.apply

    def apply(self, event, state, logger):
        if event != Event.AFTER_FORWARD or modules:
            return original(self, event, state, logger)
        stack: list[str] = []

        def profile(frame, what, arg):
            if not frame.f_code.co_filename.startswith(PACKAGE):
                return
            if what == "call":
                stack.append(f"{frame.f_globals['__name__']}:{frame.f_code.co_qualname}")
                modules.add(frame.f_globals["__name__"])
                if len(stack) > len(deepest):
                    deepest[:] = stack
            elif what == "return" and stack:
                stack.pop()

        sys.setprofile(profile)
        try:
            return original(self, event, state, logger)
        finally:
            sys.setprofile(None)

    monkeypatch.setattr(HardNegativeMining, "apply", apply)
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    return deepest[1:], modules


def test_apply_reaches_the_kernel_in_at_most_eight_calls(monkeypatch, capsys):
    chain, modules = trace_first_mining(monkeypatch)
    print(f"depth {len(chain)}: {' -> '.join(chain)}; {len(modules)} modules", file=sys.stderr)
    assert chain[0].endswith("HardNegativeMining._mine")
    assert any(name.endswith("SemiHardMiner.mine") for name in chain)
    assert len(chain) <= 8, chain
    # 18 before the ambient switch went; the goal is 10 (the algorithm and the mining step each one module).
    assert len(modules) <= 17, sorted(modules)
