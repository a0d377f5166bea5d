"""The codes of a video QA item's video: from the lwm-tokenize cache when it holds the video, else the
file read at the requested frame rate and tokenized with the VQGAN."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from lwm.data.codes import CodeStore
from lwm.eval.video_qa.items import Item, ItemError
from lwm.infer.prompt import DEFAULT_VQGAN, video_codes
from lwm.interop.vqgan_sources import load_vqgan
from lwm.video.reader import Video, VideoError
from lwm.video.tokenize import video_id


class VideoSource:
    """(T, 256) codes of an item's video: from the lwm-tokenize cache when it holds the video, else read
    and tokenized with the VQGAN (loaded at the first video that needs it)."""

    def __init__(
        self,
        codes_dir=None,
        vqgan=DEFAULT_VQGAN,
        fps: float | None = 1.0,
        max_frames: int | None = None,
        ids: str = "auto",
        device="cpu",
    ):

        self.store = CodeStore(codes_dir) if codes_dir is not None else None
        self.vqgan_path, self.fps, self.max_frames, self.ids, self.device = vqgan, fps, max_frames, ids, device
        self._vqgan = None

    def cache_id(self, item: Item) -> str | None:
        if self.store is None:
            return None

        candidates = []
        if item.video is not None:
            candidates += [video_id(item.video, s) for s in (("hashed", "stem") if self.ids == "auto" else (self.ids,))]
        if item.video_key is not None:
            candidates.append(item.video_key)
        return next((c for c in candidates if self.store.path(c).is_file()), None)

    def vqgan(self):
        if self._vqgan is None:
            if self.vqgan_path is None or not Path(self.vqgan_path).exists():
                raise ItemError(
                    "vqgan",
                    f"the video is not in the code cache and the VQGAN checkpoint "
                    f"{self.vqgan_path} to tokenize it does not exist (--vqgan)",
                )
            try:
                self._vqgan = load_vqgan(self.vqgan_path, preset="tiny").to(self.device).eval()
            except Exception as e:
                raise ItemError(
                    "vqgan", f"cannot load the VQGAN checkpoint {self.vqgan_path}: {type(e).__name__}: {e}"
                ) from e
        return self._vqgan

    def load(self, item: Item) -> tuple[np.ndarray, dict]:
        """codes (T, 256) and what to record about them: where they came from, frames, the video's length."""
        cid = self.cache_id(item)
        if cid is not None:
            try:
                codes = self.store.load(cid, max_frames=self.max_frames, fps=self.fps)
            except (FileNotFoundError, ValueError) as e:
                raise ItemError("codes", f"cached codes of {cid}: {e}") from e
            seconds = self.store.meta.get(cid, {}).get("video", {}).get("duration")
            return codes, {"codes_from": "cache", "cache_id": cid, "frames": len(codes), "video_seconds": seconds}
        if item.video is None:
            raise ItemError(
                "video_missing",
                f"video {item.video_key!r} is not in the code cache and there is no "
                f"file for it (pass --video-dir, or --codes holding it)",
            )

        if not os.path.exists(item.video):
            raise ItemError("video_missing", f"{item.video}: no such file")
        vq = self.vqgan()
        try:
            codes = video_codes(item.video, vq, fps=self.fps, max_frames=self.max_frames)
            seconds = Video(item.video, vq.config.resolution).duration if item.duration is None else None
        except VideoError as e:
            raise ItemError("video_unreadable", str(e)) from e
        return codes, {"codes_from": "video", "frames": len(codes), "video_seconds": seconds}
