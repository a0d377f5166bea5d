"""lwm-tokenize's inputs: video and image files, folders searched recursively for their extensions
(hidden names skipped), list files (one path per line, relative to the list's folder; blank and #
lines skipped) and the media files a data source's media columns name (lwm.data.form) -> one sorted
list of absolute paths, the order shards split. An image is a one-frame video (lwm.video.image)."""

from __future__ import annotations

import os
from pathlib import Path

from lwm.data.form import MEDIA_EXTENSIONS, MediaError, source_form
from lwm.data.shards import TAR, image_members
from lwm.data.sources import SourceError, open_source
from lwm.video.codes import video_id

LIST_EXTENSIONS = frozenset({".txt", ".lst", ".list"})
WALKED = MEDIA_EXTENSIONS | set(TAR)  # a webdataset shard gives its images


def _walk(folder: Path) -> list[Path]:
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [Path(root, f) for f in files if not f.startswith(".") and Path(f).suffix.lower() in WALKED]
    return found


def _expand(path: Path, allow_list: bool) -> list[Path]:
    if path.is_dir():
        return _walk(path)
    if allow_list and path.is_file() and path.suffix.lower() in LIST_EXTENSIONS:
        lines = path.read_text(errors="replace").splitlines()
        entries = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
        return [p for entry in entries for p in _expand(path.parent / Path(entry).expanduser(), allow_list=False)]
    return [path]  # a video or image, or a path that does not exist (it becomes a failure)


def collect_videos(inputs: list[str], problems: list[str] | None = None) -> list[str]:
    """Absolute paths of all videos and images named by the inputs (a webdataset shard's images as
    "<shard>::<member>"), without duplicates, sorted (the order shards split). problems: gets what stopped
    a shard's reading early (a corrupt or cut-short shard: its images before that are taken)."""
    paths = {os.path.abspath(p) for arg in inputs for p in _expand(Path(arg).expanduser(), allow_list=True)}
    found = set()
    for p in paths:
        if not p.lower().endswith(TAR):
            found.add(p)
            continue
        refs, problem = image_members(p)
        found.update(refs)
        if problem and problems is not None:
            problems.append(problem)
    return sorted(found)


def source_media(path: str, media: list[str], media_root: str | None) -> tuple[list[str], list[str]]:
    """(absolute paths of the media files the source's media columns name, in order without duplicates;
    the records whose media cannot be used, "file:line: why"), read as a run reads the source."""
    form = source_form(path, None, media, media_root, None, None)
    reader = open_source(path)
    reader.scan()
    found, problems = {}, []
    for i in range(len(reader)):
        try:
            record = reader.example(i)
            for column in media:
                if isinstance(record, dict) and record.get(column) is not None:
                    found.update(dict.fromkeys(form.media_paths(record, column)))
        except (SourceError, MediaError) as e:
            problems.append(f"{reader.where(i)}: {e}" if isinstance(e, MediaError) else str(e))
    return list(found), problems


def check_unique_ids(paths: list[str], scheme: str) -> str | None:
    """A usage error naming the clash when two videos would get the same id."""
    seen: dict[str, str] = {}
    for p in paths:
        vid = video_id(p, scheme)
        if vid in seen:
            return f"--ids {scheme}: {seen[vid]} and {p} both get the id {vid!r}; use --ids hashed"
        seen[vid] = p
    return None
