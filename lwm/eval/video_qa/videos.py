"""The codes of a video QA item's video, through lwm.video.codes (the lwm-tokenize cache when it holds
the video, else the file read and encoded with the VQGAN), each failure an ItemError of its kind."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from lwm.data.code_cache import out_of_range
from lwm.eval.video_qa.items import Item, ItemError
from lwm.interop.vqgan_sources import load_vqgan
from lwm.paths import TINY_VQGAN
from lwm.video.codes import CodeSource
from lwm.video.image import encode_pixels
from lwm.video.reader import VideoError


class VideoSource:
    """(T, 256) codes of an item's video: from the lwm-tokenize cache when it holds the video, else read
    and tokenized with the VQGAN (loaded at the first video that needs it). The last video read is kept
    (its codes only: 7 MiB for an hour at 1 fps), since the releases list a video's questions one after
    another: a benchmark's three questions of an hour-long video read and encode it once. n_codes: the
    model's vision codes; given, codes outside them are the item's error naming the codes file (or the
    video and the VQGAN), not the model's."""

    def __init__(
        self,
        codes_dir=None,
        vqgan=TINY_VQGAN,
        fps: float | None = 1.0,
        max_frames: int | None = None,
        ids: str = "auto",
        device="cpu",
        n_codes: int | None = None,
    ):
        self.vqgan_path, self.device, self.fps = vqgan, device, fps
        schemes = ("hashed", "stem") if ids == "auto" else (ids,)
        self.codes = CodeSource(fps, max_frames, cache=codes_dir, vqgan=self._load_vqgan, ids=schemes, n_codes=n_codes)
        self.store = self.codes.store
        self._last: tuple[str, object] | None = None  # (path, VideoCodes) of the last video read from its file

    def cache_id(self, item: Item) -> str | None:
        return self.codes.cache_id(item.video, item.video_key)

    def _load_vqgan(self):
        if self.vqgan_path is None or not Path(self.vqgan_path).exists():
            raise ItemError(
                "vqgan",
                f"the video is not in the code cache and the VQGAN checkpoint "
                f"{self.vqgan_path} to tokenize it does not exist (--vqgan)",
            )
        try:
            return load_vqgan(self.vqgan_path, preset="tiny").to(self.device).eval()
        except Exception as e:
            raise ItemError(
                "vqgan", f"cannot load the VQGAN checkpoint {self.vqgan_path}: {type(e).__name__}: {e}"
            ) from e

    def image_codes(self, image) -> np.ndarray:
        """(1, 256) codes of a picture given as pixels (a PIL image, as image benchmarks hand them): a one-frame
        video, as lwm-tokenize encodes an image file."""
        codes = encode_pixels(np.asarray(image.convert("RGB")), self.codes.vqgan())
        problem = out_of_range(codes, self.codes.n_codes) if self.codes.n_codes is not None else None
        if problem:
            raise ItemError("vqgan", f"the VQGAN's codes of the image {problem}: the VQGAN is not the model's")
        return codes

    def load(self, item: Item) -> tuple[np.ndarray, dict]:
        """codes (T, 256) and what to record about them: where they came from, frames, the video's length;
        also the frames' times in seconds (`timestamps`, None from a cache that has none), for subtitles."""
        cid = self.cache_id(item)
        if cid is not None:
            try:
                got = self.codes.from_cache(cid)
            except (FileNotFoundError, ValueError) as e:
                raise ItemError("codes", f"cached codes of {cid}: {e}") from e
            return got.codes, {
                "codes_from": "cache",
                "cache_id": cid,
                "frames": len(got.codes),
                "video_seconds": got.duration,
                "timestamps": got.timestamps,
            }
        if item.video is None:
            raise ItemError(
                "video_missing",
                f"video {item.video_key!r} is not in the code cache and there is no "
                f"file for it (pass --video-dir, or --codes holding it)",
            )
        if not os.path.exists(item.video):
            raise ItemError("video_missing", f"{item.video}: no such file")
        self.codes.vqgan()  # a missing or bad VQGAN is the item's "vqgan" error, not its video's
        if self._last is not None and self._last[0] == item.video:
            got = self._last[1]
        else:
            self._last = None
            try:
                got = self.codes.from_video(item.video)
            except VideoError as e:
                raise ItemError("video_unreadable", str(e)) from e
            except ValueError as e:  # its codes outside the model's vocabulary
                raise ItemError("vqgan", str(e)) from e
            self._last = (item.video, got)
        seconds = got.duration if item.duration is None else None
        info = {"codes_from": "video", "frames": len(got.codes), "video_seconds": seconds}
        return got.codes, {**info, "timestamps": got.timestamps}


def probe_seconds(path) -> float | None:
    """A video file's length from its container's header (PyAV; nothing is decoded), or None when the file
    is missing or says nothing."""
    try:
        import av

        with av.open(str(path)) as container:
            if container.duration is not None:
                return container.duration / 1_000_000  # av.time_base
            stream = container.streams.video[0]
            return float(stream.duration * stream.time_base) if stream.duration else None
    except Exception:
        return None
