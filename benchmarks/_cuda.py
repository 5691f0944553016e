"""What the GPU checks (``gpu.py``) and the GPU benchmarks share: waiting for a device's queued work, its name, and
errors as one line."""

from __future__ import annotations

import torch


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously); nothing to wait for on the CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def one_line(error: BaseException) -> str:
    """``Type: first line of the message``, as the CLI reports errors.

    Example:
        >>> one_line(ValueError("k must be >= 1, got 0.\\nmore"))
        'ValueError: k must be >= 1, got 0.'
    """
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def gpu_name(device: torch.device | str) -> str | None:
    """The GPU's name (``torch.cuda.get_device_name``) where ``device`` is CUDA and present, else ``None``.

    Example:
        >>> gpu_name("cpu") is None
        True
    """
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(device)
