"""Writes that a kill or a full disk never leaves half done.

`atomic_file(path)` (and `write_atomic` for text) writes next to the target and renames, so
a reader or a kill never leaves half a file; `writes_to(path)` turns a full disk into NoSpaceLeft,
"no space left on <path>", which every writer of the project raises. `staged_folder(out)` does the same for a
folder of files (an export): they are written into a folder beside `out` and moved in, and `out` is
refused (FolderRefused) when it holds files the writer did not make or is reached through a symlink.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from safetensors import SafetensorError


class NoSpaceLeft(OSError):
    """A write that failed for want of space (ENOSPC, or EDQUOT: the quota is spent), naming the file."""

    def __init__(self, path: str | Path, cause: OSError):
        super().__init__(cause.errno, cause.strerror)
        self.path = Path(path)

    def __str__(self) -> str:
        quota = " (disk quota exceeded)" if self.errno == errno.EDQUOT else ""
        return f"no space left on {self.path}{quota}"


@contextmanager
def writes_to(path: str | Path) -> Iterator[None]:
    """Around writes to `path`: an OSError for want of space becomes NoSpaceLeft naming `path` (a failed
    write's own error names no file), and so does safetensors' writer's, which is no OSError."""
    try:
        yield
    except NoSpaceLeft:
        raise
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise NoSpaceLeft(path, e) from e
        raise
    except SafetensorError as e:
        for code in (errno.ENOSPC, errno.EDQUOT):  # the Rust writer's error names only the OS error
            if f"os error {code})" in str(e):
                raise NoSpaceLeft(path, OSError(code, str(e))) from None
        raise


@contextmanager
def atomic_file(path: str | Path) -> Iterator[BinaryIO]:
    """A binary file that becomes `path` only when the block ends without error: it is written to
    `<path>.tmp` beside it (one filesystem, so the rename is atomic), flushed, fsynced and renamed over
    `path`. On an error the temp file is removed; a full disk raises NoSpaceLeft naming `path`."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with writes_to(path), open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # only a kill leaves it, and the next write replaces it
        raise


def write_atomic(path: str | Path, text: str) -> Path:
    """Write `text` to `path` through `atomic_file`: a reader never sees half of it."""
    with atomic_file(path) as f:
        f.write(text.encode())
    return Path(path)


# ---------------------------------------------------------------------------------------- output folders

OWN_FILES = "lwm_files.json"  # in a folder staged_folder wrote: {"made_by": ..., "files": [its files]}


class FolderRefused(ValueError):
    """An output folder a writer will not write into; the message names it and what to do."""


def _first_link(path: Path, inside: Path | None) -> Path | None:
    """The first symlink among `path`'s components as written (below `inside`, when given), path itself included."""
    parts = path.parts
    start = len(inside.parts) + 1 if inside is not None else 1
    for i in range(start, len(parts) + 1):
        if Path(*parts[:i]).is_symlink():
            return Path(*parts[:i])
    return None


def _listed(folder: Path) -> set[str] | None:
    """The files `folder`'s OWN_FILES lists; None when it has none or it is not one of ours."""
    try:
        raw = json.loads((folder / OWN_FILES).read_text())
    except (OSError, ValueError):
        return None
    files = raw.get("files") if isinstance(raw, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return None
    return set(files)


def _files(folder: Path) -> list[str]:
    """Everything in `folder` that is not a folder (links included, never followed), relative, as a/b."""
    found = []
    for root, dirs, names in os.walk(folder):  # followlinks=False: a link to a folder stays in dirs
        rel = Path(root).relative_to(folder)
        found += [(rel / n).as_posix() for n in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]]
    return sorted(found)


def complete(folder: str | Path) -> bool:
    """Whether `folder` holds a whole staged_folder output: its OWN_FILES lists files that are all there
    (an export a kill or a full disk cut short lists some missing, or has no OWN_FILES)."""
    listed = _listed(Path(folder))
    return bool(listed) and all((Path(folder) / f).is_file() for f in listed)


def check_output_folder(out: str | Path, inside: str | Path | None = None) -> None:
    """Refuse (FolderRefused) an output folder that is a symlink or is reached through one (the
    components of `out` as written; only those below `inside`, a folder the caller owns, when
    given), that is a file, or that holds files not listed in its OWN_FILES (an earlier export's
    own files, which staged_folder replaces). An absent or empty folder is fine."""
    out = Path(out)
    link = _first_link(out, Path(inside) if inside is not None else None)
    if link is not None:
        how = "is a symlink" if link == out else f"is reached through the symlink {link}, which points"
        raise FolderRefused(
            f"{out} {how} to {os.readlink(link)}; an export writes only into a real folder, never through a "
            f"link into another one: name the folder itself ({os.path.realpath(out)}) or a new one"
        )
    if not out.exists():
        return
    if not out.is_dir():
        raise FolderRefused(f"{out} is a file; name a folder for the export")
    listed = _listed(out) or set()
    foreign = [f for f in _files(out) if (f not in listed and f != OWN_FILES) or (out / f).is_symlink()]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise FolderRefused(
            f"{out} holds files an export did not make ({shown}); an export writes into an empty or new "
            f"folder, or over its own earlier export (the files its {OWN_FILES} lists): move them away or "
            "name another folder"
        )


def _install(stage: Path, out: Path, made_by: str) -> None:
    """Move `stage`'s files into `out`, replacing out's earlier files (those its OWN_FILES lists).
    OWN_FILES lists every file in `out` at every instant, so an export a kill cut short can be redone."""
    new = _files(stage)
    old = {f for f in (_listed(out) or set()) if (out / f).is_file()} if out.is_dir() else set()
    out.mkdir(exist_ok=True)

    def own(files) -> None:
        write_atomic(out / OWN_FILES, json.dumps({"made_by": made_by, "files": sorted(files)}, indent=1) + "\n")

    own(old | set(new))
    for f in new:
        (out / f).parent.mkdir(parents=True, exist_ok=True)
        os.replace(stage / f, out / f)
    for f in sorted(old - set(new)):
        (out / f).unlink(missing_ok=True)
        for parent in Path(f).parents[:-1]:  # folders left empty (vqgan/ of an export that has none now)
            if any((out / parent).iterdir()):
                break
            (out / parent).rmdir()
    own(new)


@contextmanager
def staged_folder(out: str | Path, made_by: str, inside: str | Path | None = None) -> Iterator[Path]:
    """A folder to write `out`'s files into, made beside `out` (one filesystem); when the block ends
    without error they replace `out`'s earlier files (see check_output_folder, called first), and
    OWN_FILES lists them. On an error nothing in `out` has changed."""
    out = Path(out)
    check_output_folder(out, inside)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        with writes_to(out):
            yield stage
            check_output_folder(out, inside)  # again: the writing took a while
            _install(stage, out, made_by)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
