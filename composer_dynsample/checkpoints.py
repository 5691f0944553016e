"""Checkpoint files checked before Composer unpickles them: no code runs from a file, broken files named.

Composer loads checkpoints with ``torch.load(weights_only=False)``, so a crafted file runs any code its
pickle names. :func:`check_checkpoint` first reads the file with ``torch.load(weights_only=True)``,
which refuses every class outside an allow-list, with the short list of types this project's
checkpoints hold (:data:`SAFE_GLOBALS`). A file that needs anything else is refused with the first
class it asked for; a truncated, empty or foreign file is reported in one line with what is wrong.

Before that load, the pickle is read as a list of opcodes (``pickletools``, which runs nothing) for the
storages it declares: each one's size must fit the ``data/N`` record of the zip that holds its bytes,
and each tensor view must fit its storage, since torch fills a storage longer than its record from
the memory past it. After the load, the model's floating weights must be finite.

A user who trusts a file skips these checks (``--trust-checkpoint`` on the command line); it must
still be a regular file, not a FIFO or a device that would hang the load or feed it endless bytes.
"""

from __future__ import annotations

import datetime
import errno
import os
import pickle
import pickletools
import re
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from composer_dynsample.file_checks import file_kind

__all__ = ["SAFE_GLOBALS", "CheckpointError", "check_checkpoint", "model_weights"]


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


def check_checkpoint(path: str | os.PathLike[str], *, trusted: bool = False) -> None:
    """Read a checkpoint without running code from it; raise :class:`CheckpointError` if it is unsafe or broken.

    Remote paths (``s3://...``) are not checked here; Composer downloads them itself.

    Args:
        path (str | os.PathLike): The checkpoint file.
        trusted (bool): The user trusts the file: only check that it is a regular file (a FIFO would
            hang the load, ``/dev/zero`` feed it endless bytes); its content is not read. Default:
            ``False``.

    Raises:
        CheckpointError: The path is missing, a symbolic link loop or not a regular file; or the file
            is empty, truncated, not a PyTorch checkpoint, declares a tensor larger than the bytes it
            holds for it, its pickle names a class outside :data:`SAFE_GLOBALS` (the message names it),
            it is not a Composer checkpoint (a dict whose ``state`` holds the ``model`` weights; a bare
            ``torch.save(model.state_dict())`` is not one), or a model weight is NaN or infinite.

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
    size = _regular_file_size(file)
    if trusted:
        return
    if size == 0:
        raise CheckpointError(f"checkpoint {str(file)!r} is empty (0 bytes).")
    import torch  # after the checks that need no torch, so a wrong path is said at once

    _check_records(file)
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
    _check_finite(file, state["model"])


def model_weights(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The model weights (``state.model``) of a Composer checkpoint that :func:`check_checkpoint` passed,
    loaded on the CPU with only the globals it allows; a DDP ``module.`` prefix is taken off."""
    import torch

    with torch.serialization.safe_globals(_safe_globals()):
        loaded = torch.load(Path(path).expanduser(), map_location="cpu", weights_only=True)
    return {key.removeprefix("module."): value for key, value in loaded["state"]["model"].items()}


_FIFO_WORDING = {"fifo": "a FIFO (named pipe)"}  # how a checkpoint message words the FILE_KINDS "fifo"


def _regular_file_size(file: Path) -> int:
    """The size of ``file``, a regular file (symbolic links followed), or a :class:`CheckpointError`.

    ``os.stat`` opens nothing, so a FIFO is named instead of waited on.
    """
    try:
        info = os.stat(file)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {str(file)!r} does not exist.") from None
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise CheckpointError(
                f"checkpoint {str(file)!r} is a symbolic link loop: following its links never reaches a file."
            ) from None
        raise CheckpointError(f"checkpoint {str(file)!r} cannot be read: {error.strerror}.") from None
    if not stat.S_ISREG(info.st_mode):
        kind = file_kind(info.st_mode, other="not a file", wording=_FIFO_WORDING)
        raise CheckpointError(
            f"checkpoint {str(file)!r} is {kind}, not a regular file; a checkpoint is a file written by "
            "the Trainer (torch.save)."
        )
    return info.st_size


@dataclass(frozen=True)
class _Storage:
    """A storage as the pickle declares it: ``('storage', storage_type, key, location, numel)``."""

    key: str
    type_name: str
    numel: int


def _check_records(file: Path) -> None:
    """Every storage the pickle declares fits its ``data/<key>`` record; every tensor view its storage.

    torch trusts the declared sizes: a storage longer than its record is filled from the memory past it.
    Files that are not zips (or hold no ``data.pkl``) are left to ``torch.load`` to name.
    """
    try:
        with zipfile.ZipFile(file) as archive:
            records: dict[str, int] = {}
            for info in archive.infolist():  # a name given twice counts with its shorter record
                records[info.filename] = min(info.file_size, records.get(info.filename, info.file_size))
            # torch reads the records of the first one's folder, named after the file first saved
            prefix = next(iter(records), "").split("/", 1)[0] + "/"
            if prefix + "data.pkl" not in records:
                return
            pickled = archive.read(prefix + "data.pkl")
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return  # torch.load says what is wrong with it
    try:
        declared = _DeclaredTensors(pickled)
    except (ValueError, IndexError, KeyError, TypeError) as error:
        raise CheckpointError(
            f"checkpoint {str(file)!r} is not a readable PyTorch checkpoint, truncated or corrupt: its "
            f"{prefix}data.pkl is not a valid pickle ({type(error).__name__}: {error})."
        ) from None
    for storage in declared.storages:
        _check_record(file, storage, f"{prefix}data/{storage.key}", records)
    for view in declared.views:
        _check_view(file, view, f"{prefix}data/{view.storage.key}")


def _check_record(file: Path, storage: _Storage, record: str, records: dict[str, int]) -> None:
    """``storage``'s declared bytes (element count times element size) fit in ``record``."""
    import torch

    if storage.type_name == "UntypedStorage":
        itemsize = 1
    else:
        try:
            itemsize = torch.serialization.StorageType(storage.type_name).dtype.itemsize
        except (KeyError, AttributeError):
            raise CheckpointError(
                f"checkpoint {str(file)!r} is corrupt: its pickle declares record {record!r} a "
                f"{storage.type_name!r}, which is not a torch storage type."
            ) from None
    if not isinstance(storage.numel, int) or storage.numel < 0:
        raise CheckpointError(
            f"checkpoint {str(file)!r} is corrupt: its pickle declares record {record!r} to hold "
            f"{storage.numel!r} elements."
        )
    if record not in records:
        raise CheckpointError(
            f"checkpoint {str(file)!r} is truncated or corrupt: its pickle declares a storage in record "
            f"{record!r}, which the file does not hold."
        )
    declared = storage.numel * itemsize
    if records[record] < declared:
        raise CheckpointError(
            f"checkpoint {str(file)!r} is truncated or corrupt: record {record!r} holds {records[record]} "
            f"bytes, but its pickle declares a {storage.type_name} of {storage.numel} elements "
            f"({declared} bytes) in it."
        )


def _check_view(file: Path, view: _View, record: str) -> None:
    """A tensor's elements (``offset`` plus ``(size - 1) * stride`` in each dimension) lie in its storage."""
    storage, offset, size, stride = view
    numbers = [offset, *size, *stride] if isinstance(size, tuple) and isinstance(stride, tuple) else [None]
    if not all(type(n) is int and n >= 0 for n in numbers) or len(size) != len(stride):
        return  # not plain numbers: left to torch's rebuild, which refuses what it cannot place
    if 0 in size:
        return  # an empty tensor reads nothing
    end = offset + sum((length - 1) * step for length, step in zip(size, stride)) + 1
    if end > storage.numel:
        raise CheckpointError(
            f"checkpoint {str(file)!r} is corrupt: a tensor of size {tuple(size)}, stride {tuple(stride)} "
            f"and offset {offset} reaches element {end} of record {record!r}, whose storage holds "
            f"{storage.numel} elements."
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


@dataclass(frozen=True)
class _Global:
    """A ``module.name`` the pickle refers to; only its name is kept, nothing is imported."""

    module: str
    name: str


class _View(NamedTuple):
    """The arguments of ``torch._utils._rebuild_tensor_v2`` that place a tensor in its storage."""

    storage: _Storage
    offset: Any
    size: Any
    stride: Any


_REBUILD_TENSOR = _Global("torch._utils", "_rebuild_tensor_v2")
_TORCH_SIZE = _Global("torch", "Size")
_MEMO_PUT = {"PUT", "BINPUT", "LONG_BINPUT"}
_MEMO_GET = {"GET", "BINGET", "LONG_BINGET"}
_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False, "EMPTY_TUPLE": ()}
_PLACEHOLDER_ARGS = {"PERSID", "EXT1", "EXT2", "EXT4"}  # opcodes whose argument is not the value they push


class _DeclaredTensors:
    """The storages a torch pickle declares and where its tensors lie in them, read without running it.

    The pickle's opcodes (``pickletools.genops``) move plain values (numbers, strings, tuples, names of
    globals) on a stack of this class's own; every other object is a ``None`` placeholder. A storage is
    a persistent id ``('storage', storage_type, key, location, numel)``; a tensor is
    ``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)``. As in ``torch.load``, the
    first declaration of a key is the storage every tensor on that key views.

    Attributes:
        storages (list[_Storage]): Every storage declaration, in the pickle's order.
        views (list[_View]): Every tensor's storage, offset, size and stride.

    Raises:
        ValueError, IndexError, KeyError, TypeError: The pickle is malformed.
    """

    def __init__(self, pickled: bytes) -> None:
        self.storages: list[_Storage] = []
        self.views: list[_View] = []
        self._first: dict[str, _Storage] = {}
        stack: list[Any] = []
        marks: list[int] = []
        memo: dict[Any, Any] = {}
        for opcode, arg, _ in pickletools.genops(pickled):
            name = opcode.name
            if name == "MARK":
                marks.append(len(stack))
            elif name in _MEMO_PUT or name == "MEMOIZE":
                memo[arg if name != "MEMOIZE" else len(memo)] = stack[-1]
            elif name in _MEMO_GET:
                stack.append(memo[arg])
            elif name == "GLOBAL":
                stack.append(_Global(*arg.split(" ", 1)))
            else:
                popped, marked = _pop(stack, marks, opcode)
                value = self._value(opcode, arg, popped, marked)
                stack.extend([value] * len(opcode.stack_after))  # DUP pushes two, STOP and POP none

    def _value(self, opcode: pickletools.OpcodeInfo, arg: Any, popped: list[Any], marked: list[Any]) -> Any:
        """What ``opcode`` pushes: a plain value when the check needs it, else ``None``."""
        name = opcode.name
        if name in _CONSTANTS:
            return _CONSTANTS[name]
        if name == "DUP":
            return popped[0]
        if name == "TUPLE":
            return tuple(marked)
        if name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            return tuple(popped)
        if name == "STACK_GLOBAL" and all(isinstance(part, str) for part in popped):
            return _Global(*popped)
        if name == "BINPERSID":
            return self._storage(popped[0])
        if name == "REDUCE":
            function, args = popped
            if function == _TORCH_SIZE and isinstance(args, tuple) and len(args) == 1:
                return args[0]
            tensor = function == _REBUILD_TENSOR and isinstance(args, tuple) and len(args) >= 4
            if tensor and isinstance(args[0], _Storage):
                self.views.append(_View(*args[:4]))
            return None
        if not opcode.stack_before and len(opcode.stack_after) == 1 and name not in _PLACEHOLDER_ARGS:
            return arg  # a number, string or bytes; None for EMPTY_LIST and the like
        return None

    def _storage(self, pid: Any) -> _Storage | None:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] in ("storage", b"storage")):
            return None
        type_name = pid[1].name if isinstance(pid[1], _Global) else repr(pid[1])
        storage = _Storage(str(pid[2]), type_name, pid[4])
        self.storages.append(storage)
        return self._first.setdefault(storage.key, storage)


def _pop(stack: list[Any], marks: list[int], opcode: pickletools.OpcodeInfo) -> tuple[list[Any], list[Any]]:
    """What ``opcode`` takes off the stack: the items below a mark, and those above it (if it uses one)."""
    before = opcode.stack_before
    marked: list[Any] = []
    if pickletools.markobject in before:
        start = marks.pop()
        marked, stack[start:] = stack[start:], []
        count = before.index(pickletools.markobject)
    else:
        count = len(before)
    if count > len(stack):
        raise ValueError(f"{opcode.name} finds {len(stack)} of its {count} operands on the stack")
    popped = stack[len(stack) - count :]
    del stack[len(stack) - count :]
    return popped, marked


def _check_finite(file: Path, model: dict[str, Any]) -> None:
    """The model's floating weights hold no NaN or infinity; the first one that does is named."""
    import torch

    for name, value in model.items():
        if not isinstance(value, torch.Tensor) or not (value.is_floating_point() or value.is_complex()):
            continue
        finite = torch.isfinite(value)
        if not bool(finite.all()):
            bad = value.numel() - int(finite.sum())
            raise CheckpointError(
                f"checkpoint {str(file)!r} holds broken weights: model parameter {str(name)!r} has {bad} NaN "
                f"or infinite value(s) of {value.numel()}; the run that saved it diverged or the file was "
                "altered. Load an earlier checkpoint."
            )
