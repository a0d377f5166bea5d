"""lwm-tokenize's inputs: video and image files, folders searched recursively for their extensions
(hidden names skipped) and list files (one path per line, relative to the list's folder; blank and #
lines skipped) -> one sorted list of absolute paths, the order shards split. An image is a one-frame
video (lwm.video.image)."""

from __future__ import annotations

import os
from pathlib import Path

from lwm.video.codes import video_id

VIDEO_EXTENSIONS = frozenset(".mp4 .m4v .mkv .webm .avi .mov .mpg .mpeg .ts .flv .wmv .3gp .ogv".split())
IMAGE_EXTENSIONS = frozenset(".jpg .jpeg .png .webp .bmp .gif .tif .tiff".split())
MEDIA_EXTENSIONS = VIDEO_EXTENSIONS | IMAGE_EXTENSIONS
LIST_EXTENSIONS = frozenset({".txt", ".lst", ".list"})


def is_image(path: str | os.PathLike) -> bool:
    return Path(path).suffix.lower() in IMAGE_EXTENSIONS


def _walk(folder: Path) -> list[Path]:
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [Path(root, f) for f in files if not f.startswith(".") and Path(f).suffix.lower() in MEDIA_EXTENSIONS]
    return found


def _expand(path: Path, allow_list: bool) -> list[Path]:
    if path.is_dir():
        return _walk(path)
    if allow_list and path.is_file() and path.suffix.lower() in LIST_EXTENSIONS:
        lines = path.read_text(errors="replace").splitlines()
        entries = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
        return [p for entry in entries for p in _expand(path.parent / Path(entry).expanduser(), allow_list=False)]
    return [path]  # a video or image, or a path that does not exist (it becomes a failure)


def collect_videos(inputs: list[str]) -> list[str]:
    """Absolute paths of all videos and images named by the inputs, without duplicates, sorted (the order
    shards split)."""
    paths = {os.path.abspath(p) for arg in inputs for p in _expand(Path(arg).expanduser(), allow_list=True)}
    return sorted(paths)


def check_unique_ids(paths: list[str], scheme: str) -> str | None:
    """A usage error naming the clash when two videos would get the same id."""
    seen: dict[str, str] = {}
    for p in paths:
        vid = video_id(p, scheme)
        if vid in seen:
            return f"--ids {scheme}: {seen[vid]} and {p} both get the id {vid!r}; use --ids hashed"
        seen[vid] = p
    return None
