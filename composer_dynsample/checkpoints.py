"""Checkpoint files checked before Composer unpickles them: no code runs from a file, broken files named.

Composer loads checkpoints with ``torch.load(weights_only=False)``, so a crafted file runs any code its
pickle names. :func:`check_checkpoint` first reads the file with ``torch.load(weights_only=True)``,
which refuses every class outside an allow-list, with the short list of types this project's
checkpoints hold (:data:`SAFE_GLOBALS`). A file that needs anything else is refused with the first
class it asked for; a truncated, empty or foreign file is reported in one line with what is wrong.
A user who trusts a file skips the check (``--trust-checkpoint`` on the command line).
"""

from __future__ import annotations

import datetime
import os
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

__all__ = ["SAFE_GLOBALS", "CheckpointError", "check_checkpoint"]


class CheckpointError(ValueError):
    """A checkpoint file is unsafe to unpickle, or broken; the message names the file and the problem."""


def _safe_globals() -> list[Any]:
    import numpy as np
    import torch

    multiarray = getattr(np, "_core", None) or np.core  # numpy 2 moved it
    return [
        torch.torch_version.TorchVersion,
        datetime.timedelta,
        np.dtype,
        np.ndarray,
        multiarray.multiarray._reconstruct,
        *(type(np.dtype(name)) for name in ("uint32", "int64", "float64", "float32", "bool")),
    ]


#: What a checkpoint of this project may hold besides tensors and plain containers: the torch version
#: Composer records, the ``timedelta`` of its timestamps, and numpy arrays of the saved random states.
SAFE_GLOBALS = (
    "torch.torch_version.TorchVersion",
    "datetime.timedelta",
    "numpy.dtype (and its concrete dtype classes)",
    "numpy.ndarray",
    "numpy.core.multiarray._reconstruct",
)


def check_checkpoint(path: str | os.PathLike[str]) -> None:
    """Read a checkpoint without running code from it; raise :class:`CheckpointError` if it is unsafe or broken.

    Remote paths (``s3://...``) are not checked here; Composer downloads them itself.

    Args:
        path (str | os.PathLike): The checkpoint file.

    Raises:
        CheckpointError: The file is missing, empty, truncated, not a PyTorch checkpoint, its pickle
            names a class outside :data:`SAFE_GLOBALS` (the message names it), or it is not a Composer
            checkpoint (a dict whose ``state`` holds the ``model`` weights; a bare
            ``torch.save(model.state_dict())`` is not one).

    Example:
        >>> import tempfile, torch
        >>> path = tempfile.mktemp(suffix=".pt")
        >>> torch.save({"state": {"model": {"w": torch.zeros(2)}}}, path)
        >>> check_checkpoint(path)  # returns quietly
        >>> open(path, "wb").close()
        >>> check_checkpoint(path)
        Traceback (most recent call last):
            ...
        composer_dynsample.checkpoints.CheckpointError: checkpoint ... is empty (0 bytes).
    """
    file = Path(path).expanduser()
    if not file.is_file():
        raise CheckpointError(f"checkpoint {str(file)!r} does not exist or is not a file.")
    size = file.stat().st_size
    if size == 0:
        raise CheckpointError(f"checkpoint {str(file)!r} is empty (0 bytes).")
    import torch  # after the checks that need no torch, so a wrong path is said at once

    try:
        with torch.serialization.safe_globals(_safe_globals()):
            loaded = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(_unsafe_message(file, str(error))) from None
    except (RuntimeError, EOFError, OSError, MemoryError, zipfile.BadZipFile, ValueError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(
            f"checkpoint {str(file)!r} ({size} bytes) is not a readable PyTorch checkpoint, truncated or "
            f"corrupt: {type(error).__name__}: {reason}"
        ) from None
    state = loaded.get("state") if isinstance(loaded, dict) else None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise CheckpointError(
            f"checkpoint {str(file)!r} is not a Composer checkpoint: it holds {_holds(loaded)}, not a dict "
            "whose 'state' holds the 'model' weights (as the Trainer saves them; a file of "
            "torch.save(model.state_dict()) is not one)."
        )


def _holds(value: Any) -> str:
    """What a loaded file holds, in a few words: ``a list``, ``a dict with keys ['a', 'b', ...]``."""
    if not isinstance(value, dict):
        return f"a {type(value).__name__}"
    keys = [str(key) for key in list(value)[:3]]
    return f"a dict with keys {keys}{' and more' if len(value) > 3 else ''}"


def _unsafe_message(file: Path, error: str) -> str:
    """One line out of torch's many: the class the pickle asked for, or what is broken."""
    named = re.search(r"GLOBAL (\S+)", error)
    if named is None:
        detail = next((line.strip() for line in error.splitlines() if "error" in line.lower()), "")
        detail = detail.split("error:", 1)[-1].strip() or "an unreadable pickle"
        return (
            f"checkpoint {str(file)!r} is not a readable PyTorch checkpoint, truncated or corrupt: {detail}"
        )
    return (
        f"checkpoint {str(file)!r} was refused: its pickle asks for {named.group(1)}, which a checkpoint of "
        "this project never holds, and loading it could run code. If you trust the file, pass "
        "--trust-checkpoint."
    )
