"""Read the tensors of a TorchScript archive without running any of its code.

TorchScript's own loader (``torch.jit``) compiles the archive's ``code/`` and runs it: a
TorchScript class's ``__setstate__`` executes while the archive loads. OpenAI's CLIP checkpoints
(``ViT-B-32.pt``, ``RN50.pt``, ...) are such archives, so attn-zoo reads them here instead:

* ``<prefix>/data.pkl`` -- the module tree -- is unpickled by a restricted unpickler that
  builds tensors and plain containers only. Every ``__torch__.*`` class becomes an inert
  :class:`ScriptObject` that records the state it is given; any other global is refused.
* Tensor bytes come from ``<prefix>/data/<key>`` (little-endian, as torch writes them).
* Which attributes are parameters / buffers is read from the ``__parameters__`` /
  ``__buffers__`` lists of the class definitions in ``<prefix>/code/``, parsed with
  :mod:`ast` (parsed, never compiled or run). The result matches
  the ``state_dict()`` of the module TorchScript's loader returns.

A module whose class defines ``__setstate__`` (state that only archive code can restore)
is refused with :class:`~attn_core.hub.UnsafeCheckpointError`.
"""

from __future__ import annotations

import ast
import io
import os
import pickle
import re
import sys
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from .errors import CheckpointError, UnsafeCheckpointError

__all__ = ["ScriptObject", "is_torchscript_archive", "read_torchscript_archive"]

_NOTE = "TorchScript archives are read as tensors only"


def is_torchscript_archive(path: str | os.PathLike) -> bool:
    """True for a zip that ``torch.jit.save`` wrote: ``<prefix>/data.pkl`` plus
    ``<prefix>/constants.pkl`` or ``<prefix>/code/`` (a ``torch.save`` zip has neither)."""
    try:
        if not zipfile.is_zipfile(path):
            return False
        with zipfile.ZipFile(path) as zf:
            return _find_prefix(zf.namelist()) is not None
    except OSError:
        return False


def _find_prefix(names: list[str]) -> str | None:
    """The archive's top folder, if it holds a TorchScript module; else None."""
    prefixes = [n[: -len("/data.pkl")] for n in names if re.fullmatch(r"[^/]+/data\.pkl", n)]
    if len(prefixes) != 1:
        return None
    prefix = prefixes[0]
    if f"{prefix}/constants.pkl" in names or any(n.startswith(f"{prefix}/code/") for n in names):
        return prefix
    return None


# -- the pieces data.pkl is allowed to build ------------------------------------------------


class ScriptObject:
    """Inert stand-in for an instance of a ``__torch__.*`` class: it only records its state.

    One subclass per class name is made with :func:`type`; no archive code is looked up.
    """

    qualname: ClassVar[str] = "__torch__"
    state: Any = None
    args: tuple[Any, ...] = ()

    def __init__(self, *args: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"<ScriptObject {self.qualname}>"


@dataclass(frozen=True, slots=True)
class _StorageType:
    """What ``torch FloatStorage`` (etc.) unpickles to: just its dtype."""

    dtype: torch.dtype


@dataclass(frozen=True, slots=True)
class _Storage:
    """One storage read from ``data/<key>``."""

    dtype: torch.dtype
    untyped: torch.UntypedStorage


def _storage_types() -> dict[str, torch.dtype]:
    """``<ScalarType>Storage`` names (as the TorchScript pickler writes them) -> dtype."""
    legacy = {
        "DoubleStorage": torch.float64,
        "FloatStorage": torch.float32,
        "HalfStorage": torch.float16,
        "BFloat16Storage": torch.bfloat16,
        "LongStorage": torch.int64,
        "IntStorage": torch.int32,
        "ShortStorage": torch.int16,
        "CharStorage": torch.int8,
        "ByteStorage": torch.uint8,
        "BoolStorage": torch.bool,
        "ComplexFloatStorage": torch.complex64,
        "ComplexDoubleStorage": torch.complex128,
    }
    newer = {  # c10 ScalarType name -> torch attribute; only those this torch has
        "ComplexHalf": "complex32",
        "UInt16": "uint16",
        "UInt32": "uint32",
        "UInt64": "uint64",
        "Float8_e4m3fn": "float8_e4m3fn",
        "Float8_e5m2": "float8_e5m2",
        "Float8_e4m3fnuz": "float8_e4m3fnuz",
        "Float8_e5m2fnuz": "float8_e5m2fnuz",
    }
    for scalar, attr in newer.items():
        dtype = getattr(torch, attr, None)
        if isinstance(dtype, torch.dtype):
            legacy[f"{scalar}Storage"] = dtype
    return legacy


_STORAGE_TYPES = _storage_types()


def _rebuild_tensor_v2(
    storage: _Storage,
    storage_offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    requires_grad: bool,
    backward_hooks: Any,
    metadata: Any = None,
) -> torch.Tensor:
    """Stand-in for ``torch._utils._rebuild_tensor_v2``: a view of a storage, nothing more."""
    if not isinstance(storage, _Storage):
        raise TypeError(f"tensor built from {type(storage).__name__}, not an archive storage")
    if backward_hooks or metadata:
        raise TypeError("tensor with backward hooks or metadata")
    tensor = torch.empty((0,), dtype=storage.dtype)
    return tensor.set_(storage.untyped, storage_offset, tuple(size), tuple(stride))


def _identity(value: Any, *_: Any) -> Any:
    """Stand-in for ``torch.jit._pickle.build_*list`` / ``restore_type_tag``."""
    return value


_ALLOWED: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("collections", "OrderedDict"): OrderedDict,
    **{
        ("torch.jit._pickle", name): _identity
        for name in (
            "build_intlist",
            "build_doublelist",
            "build_boollist",
            "build_tensorlist",
            "restore_type_tag",
        )
    },
}


class _Unpickler(pickle.Unpickler):
    """Builds tensors, containers and :class:`ScriptObject` placeholders; refuses the rest."""

    def __init__(self, data: bytes, zf: zipfile.ZipFile, prefix: str, path: Path) -> None:
        super().__init__(io.BytesIO(data))
        self.zf, self.prefix, self.path = zf, prefix, path
        self.byteorder = _byteorder(zf, prefix, path)
        self.archive_size = path.stat().st_size
        self.storages: dict[str, _Storage] = {}
        self.classes: dict[str, type[ScriptObject]] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module == "__torch__" or module.startswith("__torch__."):
            qualname = f"{module}.{name}"
            if qualname not in self.classes:
                attrs = {"qualname": qualname, "__module__": __name__}
                self.classes[qualname] = type(name, (ScriptObject,), attrs)
            return self.classes[qualname]
        if module == "torch" and name in _STORAGE_TYPES:
            return _StorageType(_STORAGE_TYPES[name])
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        raise UnsafeCheckpointError(
            f"refusing global '{module}.{name}' in {self.path.name}: {_NOTE} ({self.path})"
        )

    def persistent_load(self, pid: Any) -> _Storage:
        if not (
            isinstance(pid, tuple)
            and len(pid) == 5
            and pid[0] == "storage"
            and isinstance(pid[1], _StorageType)
            and isinstance(pid[2], str)
            and isinstance(pid[4], int)
        ):
            raise UnsafeCheckpointError(
                f"refusing persistent id {pid!r:.80} in {self.path.name}: {_NOTE} ({self.path})"
            )
        _, storage_type, key, _location, numel = pid
        if key not in self.storages:
            untyped = self._read_storage(key, storage_type.dtype, numel)
            self.storages[key] = _Storage(storage_type.dtype, untyped)
        storage = self.storages[key]
        if storage.dtype != storage_type.dtype:
            raise CheckpointError(f"storage data/{key} in {self.path} is read with two dtypes")
        return storage

    def _read_storage(self, key: str, dtype: torch.dtype, numel: int) -> torch.UntypedStorage:
        """The bytes of ``data/<key>`` in a fresh buffer the storage keeps alive."""
        name = f"{self.prefix}/data/{key}"
        try:
            info = self.zf.getinfo(name)
        except KeyError:
            raise CheckpointError(f"missing storage '{name}' in {self.path}") from None
        nbytes = numel * dtype.itemsize
        stored = info.compress_type == zipfile.ZIP_STORED
        if stored and info.file_size > self.archive_size:  # a lying header: allocate nothing
            raise CheckpointError(f"storage '{name}' in {self.path} is larger than the archive")
        if numel < 0 or info.file_size != nbytes:
            raise CheckpointError(
                f"storage '{name}' in {self.path} holds {info.file_size} bytes, "
                f"expected {numel} x {dtype} = {nbytes}"
            )
        if nbytes == 0:
            return torch.UntypedStorage(0)
        buffer = bytearray(nbytes)
        with self.zf.open(info) as f:
            if f.readinto(buffer) != nbytes:
                raise CheckpointError(f"storage '{name}' in {self.path} is truncated")
        # frombuffer shares the bytearray and holds a reference to it: no second copy.
        raw = torch.frombuffer(buffer, dtype=torch.uint8)
        if self.byteorder != sys.byteorder:
            unit = dtype.itemsize // 2 if dtype.is_complex else dtype.itemsize
            raw = raw.view(-1, unit).flip(-1).reshape(-1) if unit > 1 else raw
        return raw.untyped_storage()


def _byteorder(zf: zipfile.ZipFile, prefix: str, path: Path) -> str:
    """``little`` unless ``<prefix>/byteorder`` says otherwise (old archives lack the file)."""
    try:
        order = zf.read(f"{prefix}/byteorder").decode("ascii").strip()
    except KeyError:
        return "little"
    if order not in ("little", "big"):
        raise CheckpointError(f"unknown byte order {order!r} in {path}")
    return order


# -- which attributes are parameters / buffers: the class definitions in code/ --------------


@dataclass(frozen=True, slots=True)
class _ClassInfo:
    is_module: bool
    parameters: frozenset[str] | None  # None: the class does not declare ``__parameters__``
    buffers: frozenset[str]
    has_setstate: bool


class _CodeIndex:
    """Class definitions of ``<prefix>/code/``, parsed (never compiled) on demand."""

    def __init__(self, zf: zipfile.ZipFile, prefix: str, path: Path) -> None:
        self.zf, self.prefix, self.path = zf, prefix, path
        self.files: dict[str, dict[str, _ClassInfo]] = {}

    def get(self, qualname: str) -> _ClassInfo | None:
        module, _, name = qualname.rpartition(".")
        if module not in self.files:
            self.files[module] = self._parse(module)
        return self.files[module].get(name)

    def _parse(self, module: str) -> dict[str, _ClassInfo]:
        name = f"{self.prefix}/code/{module.replace('.', '/')}.py"
        try:
            source = self.zf.read(name).decode("utf-8")
        except KeyError:
            return {}
        try:
            tree = ast.parse(source, filename=name)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
            raise CheckpointError(f"cannot parse '{name}' in {self.path}: {e}") from None
        return {
            node.name: _class_info(node) for node in tree.body if isinstance(node, ast.ClassDef)
        }


def _class_info(node: ast.ClassDef) -> _ClassInfo:
    lists: dict[str, frozenset[str]] = {}
    for stmt in node.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target = stmt.targets[0]
            if isinstance(target, ast.Name) and target.id in ("__parameters__", "__buffers__"):
                try:
                    names = ast.literal_eval(stmt.value)
                except ValueError:
                    names = []
                lists[target.id] = frozenset(n for n in names if isinstance(n, str))
    return _ClassInfo(
        is_module=any(isinstance(b, ast.Name) and b.id == "Module" for b in node.bases),
        parameters=lists.get("__parameters__"),
        buffers=lists.get("__buffers__", frozenset()),
        has_setstate=any(
            isinstance(s, ast.FunctionDef) and s.name == "__setstate__" for s in node.body
        ),
    )


# -- the reader -----------------------------------------------------------------------------


def read_torchscript_archive(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The state dict of a ``torch.jit.save`` archive (CPU tensors), read without its code.

    Names and order match the ``state_dict()`` of the module TorchScript's loader returns:
    each module's parameters, then its buffers, then its submodules. Raises
    :class:`CheckpointError` (a ``ValueError``) for anything that is not such an archive and
    :class:`UnsafeCheckpointError` for a refused global or a module whose state only archive
    code can restore.
    """
    path = Path(path)
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise CheckpointError(f"cannot read {path} as a TorchScript archive: {e}") from None
    with zf:
        prefix = _find_prefix(zf.namelist())
        if prefix is None:
            raise CheckpointError(
                f"{path} is not a TorchScript archive (no <name>/data.pkl with code/)"
            )
        unpickler = _Unpickler(zf.read(f"{prefix}/data.pkl"), zf, prefix, path)
        try:
            root = unpickler.load()
        except CheckpointError:
            raise
        except Exception as e:  # malformed pickle: UnpicklingError, EOFError, TypeError, ...
            raise CheckpointError(
                f"cannot read {prefix}/data.pkl in {path}: {type(e).__name__}: {e}"
            ) from None
        code = _CodeIndex(zf, prefix, path)
        out: dict[str, torch.Tensor] = {}
        try:
            _collect(root, "", code, path, out, set())
        except RecursionError:
            raise CheckpointError(f"module tree of {path} is nested too deeply") from None
        return out


def _collect(
    obj: Any,
    prefix: str,
    code: _CodeIndex,
    path: Path,
    out: dict[str, torch.Tensor],
    active: set[int],
) -> None:
    """Add ``obj``'s parameters, buffers, then its submodules' (depth first) to ``out``."""
    info = code.get(obj.qualname) if isinstance(obj, ScriptObject) else None
    where = f"'{prefix[:-1]}'" if prefix else "the root module"
    if info is None or not info.is_module:
        raise CheckpointError(f"{where} of {path} is not a TorchScript module ({obj!r})")
    if info.has_setstate:
        raise UnsafeCheckpointError(
            f"refusing {obj.qualname} ({where}) in {path.name}: its class defines "
            f"__setstate__, code that TorchScript's loader would run; {_NOTE} ({path})"
        )
    if info.parameters is None:
        raise CheckpointError(
            f"{obj.qualname} ({where}) in {path} declares no __parameters__: cannot tell "
            "its parameters from other attributes"
        )
    if not isinstance(obj.state, dict) or id(obj) in active:
        raise CheckpointError(f"{where} of {path} has a malformed state")
    state: dict[str, Any] = obj.state
    for kind in (info.parameters, info.buffers):
        for name, value in state.items():
            if name in kind and isinstance(value, torch.Tensor):
                out[prefix + name] = value.detach()  # drops anything BUILD may have set
    active.add(id(obj))
    for name, value in state.items():
        if isinstance(value, ScriptObject):
            child = code.get(value.qualname)
            if child is not None and child.is_module:
                _collect(value, f"{prefix}{name}.", code, path, out, active)
    active.discard(id(obj))
