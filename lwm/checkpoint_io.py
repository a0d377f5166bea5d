"""Stage checkpoints on disk: written atomically next to their target, checksummed, and read back
without running anything from the file.

Writing: the bytes go to a temporary file in the target's folder, are flushed to disk, and replace
the target with one rename, so a kill at any moment leaves the previous checkpoint or the new one,
never a torn file (Lightning's own writer stages the file in $TMPDIR and moves it, which across
filesystems is truncate-then-copy). A `<name>.sha256` beside it is written the same way, after it.

Reading: the checksum is verified when present (a run folder from elsewhere may lack it), and the
file is read with `torch.load(weights_only=True)`: tensors and plain data only, no pickled objects.
Sharded checkpoints (a folder) have their `.metadata` read with an unpickler that knows only the
checkpoint format's own classes, and their non-tensor entries checked with `weights_only=True`,
before torch.distributed.checkpoint (which unpickles both freely) is let near them.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import struct
from pathlib import Path

import torch

from lwm.io import atomic_file, write_atomic

CHUNK = 1 << 20
# What torch's unpickler raises on bytes that are no torch file, cut short or corrupted: junk opcodes
# pop an empty stack (IndexError), read an unset memo (KeyError), or unpack too few bytes (struct.error).
UNREADABLE = (EOFError, RuntimeError, IndexError, KeyError, struct.error, TypeError, ValueError, UnicodeDecodeError)


class CheckpointError(ValueError):
    """A checkpoint that cannot be trusted or read; the message names the file and what to do."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def checksum_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def save_verified(obj, path: Path) -> None:
    """torch.save `obj` at `path` atomically, then its checksum beside it (a full disk: NoSpaceLeft)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as f:
        torch.save(obj, f)
    write_sums({Path(path).name: sha256(Path(path))}, checksum_path(Path(path)))


def write_sums(sums: dict[str, str], path: Path) -> None:
    """A sha256sum-style file: one `<hex>  <name>` line per file."""
    write_atomic(path, "".join(f"{digest}  {name}\n" for name, digest in sorted(sums.items())))


def read_sums(path: Path) -> dict[str, str]:
    sums = {}
    for line in Path(path).read_text().splitlines():
        digest, _, name = line.partition("  ")
        if not name or len(digest) != 64:
            raise CheckpointError(f"{path}: not a checksum line: {line!r}")
        sums[name] = digest
    return sums


def verify(path: Path) -> None:
    """Refuse a file whose checksum file disagrees with its bytes (no checksum file: nothing to verify)."""
    path = Path(path)
    sums = checksum_path(path)
    if sums.is_file() and read_sums(sums).get(path.name) != sha256(path):
        raise CheckpointError(
            f"{path} does not match its checksum in {sums}: the file is corrupted or was cut short; "
            "resume from another checkpoint or delete it to start the stage again"
        )


def load_verified(path: Path, map_location="cpu") -> dict:
    """A checkpoint file's contents: checksum verified, tensors and plain data only."""
    path = Path(path)
    verify(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"refusing to load {path}: it holds objects other than tensors and plain data, which would run "
            f"code when unpickled ({str(e).splitlines()[0]})"
        ) from None
    except (*UNREADABLE, OSError) as e:
        raise CheckpointError(
            f"{path} is cut short or corrupted and cannot be read ({type(e).__name__}: {e})"
        ) from None


# ----------------------------------------------------------------------------------------- sharded checkpoints

_META = "torch.distributed.checkpoint.metadata"
# What a `.metadata` pickle names (listed from sharded checkpoints saved by DCP and by the strategy):
# the format's dataclasses, the memory-format enum, torch.Size and pathlib paths. Anything else in
# those modules (os, which both import, and what a dotted name reaches through it) is refused.
_CLASSES = {
    *((_META, n) for n in ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties")),
    *((_META, n) for n in ("TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata")),
    (_META, "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    *((m, n) for m in ("pathlib", "pathlib._local") for n in ("PosixPath", "PurePosixPath")),
    *((m, n) for m in ("pathlib", "pathlib._local") for n in ("WindowsPath", "PureWindowsPath")),
}
# The one function: it maps a layout's name to torch's layout object (TensorProperties.layout).
_FUNCTIONS = {("torch.serialization", "_get_layout")}


class _MetadataUnpickler(pickle.Unpickler):
    """Only the classes a torch.distributed.checkpoint `.metadata` file is made of."""

    def find_class(self, module: str, name: str):
        refused = pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")
        if "." in name:  # protocol 4 follows a dotted name from the module: os.system through any import
            raise refused
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) in _FUNCTIONS:
            return super().find_class(module, name)
        if (module, name) not in _CLASSES:
            raise refused
        found = super().find_class(module, name)
        if not isinstance(found, type):
            raise refused
        return found


def _read_metadata(meta_file: Path):
    """A `.metadata` file's Metadata, unpickled with nothing but the format's own classes."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        with open(meta_file, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except Exception as e:  # junk bytes raise anything from EOFError to KeyError: refused all the same
        raise CheckpointError(f"refusing {meta_file}: {e}") from None
    if not isinstance(metadata, Metadata):
        raise CheckpointError(
            f"refusing {meta_file}: it holds a {type(metadata).__name__}, not a checkpoint's Metadata"
        )
    return metadata


def _inside(folder: Path, fqn: str, relative_path) -> Path:
    """The file an entry is stored in, which must be inside the checkpoint's folder."""
    if not isinstance(relative_path, str) or Path(relative_path).is_absolute() or ".." in Path(relative_path).parts:
        raise CheckpointError(f"refusing {folder}: entry {fqn!r} names {relative_path!r}, outside the checkpoint")
    return Path(folder) / relative_path


def check_sharded(folder: Path) -> None:
    """Refuse a sharded checkpoint folder whose metadata or non-tensor entries hold code, or whose
    entries name files outside it."""
    meta_file = Path(folder) / ".metadata"
    if not meta_file.is_file():
        raise CheckpointError(f"{folder} has no .metadata: not a complete sharded checkpoint")
    metadata = _read_metadata(meta_file)
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    storage = metadata.storage_data or {}
    try:
        files = {index: _inside(folder, index.fqn, info.relative_path) for index, info in storage.items()}
    except (AttributeError, TypeError) as e:  # entries that are not the format's: nothing to read them by
        raise CheckpointError(f"refusing {meta_file}: its entries are malformed ({e})") from None
    for index, info in storage.items():
        if not isinstance(metadata.state_dict_metadata.get(index.fqn), BytesStorageMetadata):
            continue
        with open(files[index], "rb") as f:
            f.seek(info.offset)
            blob = io.BytesIO(f.read(info.length))
        try:
            torch.load(blob, map_location="cpu", weights_only=True)
        except Exception as e:  # anything but plain data: refused before DCP unpickles it
            raise CheckpointError(f"refusing {folder}: entry {index.fqn!r} is not plain data ({e})") from None
