"""Stage checkpoints on disk: written atomically next to their target, checksummed, and read back
without running anything from the file.

Writing: the bytes go to a temporary file in the target's folder, are flushed to disk, and replace
the target with one rename, so a kill at any moment leaves the previous checkpoint or the new one,
never a torn file (Lightning's own writer stages the file in $TMPDIR and moves it, which across
filesystems is truncate-then-copy). The checksum is taken as the bytes are written and installed with
the file (`install`): a kill at any instant leaves a file that matches its checksum.

Reading: the checksum is verified when present (a run folder from elsewhere may lack it), and the
file is read with `torch.load(weights_only=True)`: tensors and plain data only, no pickled objects.
Sharded checkpoints (a folder) have their `.metadata` read with an unpickler that knows only the
checkpoint format's own classes, and their non-tensor entries checked with `weights_only=True`,
before torch.distributed.checkpoint (which unpickles both freely) is let near them.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import struct
from pathlib import Path

import torch

from lwm.disk.writes import write_atomic, writes_to

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


def pending_checksum_path(path: Path) -> Path:
    """The checksum of a file about to be renamed into place; it becomes `<name>.sha256` right after."""
    return path.with_name(path.name + ".sha256.new")


def install(tmp: Path, path: Path, digest: str) -> None:
    """Rename a finished `tmp` (whose sha256 is `digest`) over `path`, its checksum with it: the new
    sum is written aside first, then the file is renamed in, then the sum. At every instant the file
    at `path` matches `<name>.sha256` or, between the two renames, `<name>.sha256.new`."""
    pending = pending_checksum_path(path)
    write_sums({path.name: digest}, pending)
    os.replace(tmp, path)
    os.replace(pending, checksum_path(path))


class _HashingWriter:
    """The file torch.save writes through: hashes the bytes on their way (torch's zip writer writes in
    order, never seeking back) and keeps the OSError a write raised, which the zip writer turns into
    a RuntimeError that says nothing of it ("unexpected pos")."""

    def __init__(self, f):
        self.f, self.hash, self.error = f, hashlib.sha256(), None

    def write(self, data) -> int:
        try:
            n = self.f.write(data)
        except OSError as e:
            self.error = e
            raise
        self.hash.update(data)
        return n

    def flush(self) -> None:
        self.f.flush()


def _write_hashed(obj, tmp: Path, path: Path) -> str:
    """torch.save `obj` to `tmp`, on disk when this returns; its sha256. A full disk: NoSpaceLeft(path)."""
    with writes_to(path), open(tmp, "wb") as f:
        out = _HashingWriter(f)
        try:
            torch.save(obj, out)
        except RuntimeError:
            if out.error is not None:
                raise out.error from None  # the disk's own error: writes_to names the file if it is full
            raise
        f.flush()
        os.fsync(f.fileno())
    return out.hash.hexdigest()


def save_verified(obj, path: Path) -> None:
    """torch.save `obj` at `path` atomically with its checksum beside it (install); the bytes go to
    `<name>.tmp` beside it first. A full disk raises NoSpaceLeft naming `path`, the old file kept."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        install(tmp, path, _write_hashed(obj, tmp, path))
    finally:
        tmp.unlink(missing_ok=True)  # renamed: gone already; else a failed write's leftover


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


RESUME_ADVICE = "resume from another checkpoint or delete it to start the stage again"


def verify(path: Path, advice: str = RESUME_ADVICE) -> None:
    """Refuse a file whose bytes match neither its checksum nor a pending one (install); no checksum
    file at all (a folder from elsewhere): nothing to verify."""
    path = Path(path)
    sums = [p for p in (checksum_path(path), pending_checksum_path(path)) if p.is_file()]
    if not sums:
        return
    digest = sha256(path)
    if not any(read_sums(p).get(path.name) == digest for p in sums):
        raise CheckpointError(
            f"{path} does not match its checksum in {sums[0]}: the file is corrupted or was cut short; {advice}"
        )


SUMS = "SHA256SUMS"  # in a sharded checkpoint's folder: every file's sha256 (the strategy writes it)


def _listed(folder: Path, sums_file: Path, name: str) -> Path:
    """A file a checksum list names, which must be one directly inside its folder."""
    if Path(name).name != name or name in ("", ".", ".."):
        raise CheckpointError(f"{sums_file}: {name!r} names a file outside {folder}")
    return folder / name


def verify_folder(folder: Path) -> None:
    """Refuse a sharded checkpoint whose files disagree with its SHA256SUMS (none: nothing to verify)."""
    folder = Path(folder)
    sums_file = folder / SUMS
    if not sums_file.is_file():
        return
    sums = read_sums(sums_file)
    files = {name: _listed(folder, sums_file, name) for name in sums}
    bad = [name for name, digest in sums.items() if not files[name].is_file() or sha256(files[name]) != digest]
    if bad:
        raise CheckpointError(
            f"{folder}: {bad} do not match {sums_file}: the checkpoint is corrupted or was cut short; {RESUME_ADVICE}"
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
