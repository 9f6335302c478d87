"""Turn user video inputs (bytes, base64, data URL, local path, decoded frames) into sampled,
resized frames plus a content hash, with bounds that stop a "video bomb" before it costs much.

Encoded videos are decoded with PyAV. The header is checked first (a video stream, frame size,
frame rate, duration, frame count), the frames to keep are chosen as the model's processor
samples them (``video_preprocess.sample_indices``), and only those frames are converted to
pixels and resized; far-apart frames are reached by seeking rather than by decoding every
frame in between. Every failure is a ``VideoError`` (a ``ValueError``: HTTP 400) whose
message says what is wrong; no library message with addresses is shown.
"""

from __future__ import annotations

import io
import logging
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from sglang.srt.multimodal.image_io import ImageError, _read_bytes, content_hash
from sglang.srt.multimodal.video_preprocess import (
    VideoSettings,
    resize_frames,
    resized_size,
    sample_indices,
)

logger = logging.getLogger(__name__)

SEEK_GAP_S = 2.0  # seek when the next kept frame is further ahead than this


class VideoError(ImageError):
    """Raised for video input that cannot be used; the message says why."""


@dataclass(frozen=True)
class VideoLimits:
    max_duration_s: float = 600.0
    max_frames: int = 100_000  # frames in the stream (header or decoded)
    max_fps: float = 240.0
    max_pixels_per_frame: int = 3840 * 2160
    max_decoded_bytes: int = 1 << 30  # kept frames at their native size, RGB
    max_decoded_pixels: int = 1 << 34  # every frame the decoder outputs (seeking skips some)
    max_decode_seconds: float = 120.0


@dataclass
class LoadedVideo:
    """A validated video: content hash of its input, its kept frames resized for the model
    (n, h, w, 3) uint8, and the rate those frames were sampled at."""

    hash: int
    frames: np.ndarray
    sampled_fps: float
    native_size: tuple[int, int]  # (width, height)
    indices: np.ndarray | None = None  # of the kept frames in the stream (None: 0..n-1)
    native_fps: float = 0.0  # of the stream (decoded frames: the sampling rate)
    settings: VideoSettings | None = None  # the sampling it was loaded with


class DecodedVideoCache:
    """Encoded videos decoded before, by content hash and sampling settings, under a byte
    budget (least recently used out): a chat client re-sends its clip with every turn. Entries
    are read-only frames."""

    def __init__(self, capacity_bytes: int = 256 << 20) -> None:
        self.capacity_bytes = capacity_bytes
        self._videos: OrderedDict[int, LoadedVideo] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: int) -> LoadedVideo | None:
        """``key``: the input's hash with the settings it is sampled under (``cache_key``)."""
        with self._lock:
            video = self._videos.get(key)
            if video is not None:
                self._videos.move_to_end(key)
            return video

    def put(self, key: int, video: LoadedVideo) -> None:
        size = video.frames.nbytes
        if size > self.capacity_bytes:
            return
        video.frames.flags.writeable = False
        with self._lock:
            if key in self._videos:
                return
            self._videos[key] = video
            self._bytes += size
            while self._bytes > self.capacity_bytes:
                _, old = self._videos.popitem(last=False)
                self._bytes -= old.frames.nbytes


def load_video(
    source: Any,
    settings: VideoSettings,
    allowed_local_dir: str | None = "*",
    limits: VideoLimits | None = None,
    seen: DecodedVideoCache | None = None,
) -> LoadedVideo:
    """Validate, sample and resize one video. Decoded frames ((n, H, W, 3) uint8 array or a
    list of PIL images) are taken as already sampled at ``settings.fps``. With ``seen``, an
    encoded video decoded before is not decoded again."""
    if isinstance(source, LoadedVideo):
        return source
    limits = limits or VideoLimits()
    if isinstance(source, np.ndarray) or (
        isinstance(source, (list, tuple)) and source and not isinstance(source[0], (str, bytes))
    ):
        frames = _as_frames(source)
        _check_frame_size(frames.shape[2], frames.shape[1], limits)
        key = content_hash(repr(frames.shape).encode(), frames.tobytes())
        return _loaded(key, frames, settings.fps, settings, np.arange(len(frames)), settings.fps)
    data = _read_video_bytes(source, allowed_local_dir)
    key = content_hash(b"video", data)
    cache_key = content_hash(key.to_bytes(8, "little"), settings.digest())
    video = seen.get(cache_key) if seen is not None else None
    if video is None:
        frames, sampled_fps, indices, native_fps = _decode_checked(data, settings, limits)
        video = _loaded(key, frames, sampled_fps, settings, indices, native_fps)
        if seen is not None:
            seen.put(cache_key, video)
    return video


def _read_video_bytes(source: Any, allowed_local_dir: str | None) -> bytes:
    try:
        return _read_bytes(source, allowed_local_dir)
    except VideoError:
        raise
    except ImageError as exc:
        raise VideoError(str(exc).replace("image", "video")) from None


def _loaded(
    key: int,
    frames: np.ndarray,
    fps: float,
    s: VideoSettings,
    indices: np.ndarray,
    native_fps: float,
) -> LoadedVideo:
    if len(frames) < s.min_frames_kept:
        raise VideoError(f"the video has {len(frames)} frame(s): too few for the model")
    height, width = frames.shape[1:3]
    try:
        size = resized_size(len(frames), height, width, s)
    except ValueError as exc:
        raise VideoError(f"cannot resize the video: {exc}") from None
    resized = resize_frames(frames, size, s.resample)
    return LoadedVideo(key, resized, fps, (width, height), indices, native_fps, s)


def _as_frames(source: Any) -> np.ndarray:
    if isinstance(source, np.ndarray):
        frames = source
    else:
        frames = np.stack([np.asarray(frame.convert("RGB")) for frame in source])
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise VideoError(
            f"decoded video frames must be a uint8 array of shape (n, height, width, 3), got "
            f"{frames.dtype} {frames.shape}"
        )
    return frames


def _check_frame_size(width: int, height: int, limits: VideoLimits) -> None:
    if width <= 0 or height <= 0:
        raise VideoError(f"the video's frame size {width}x{height} is invalid")
    if width * height > limits.max_pixels_per_frame:
        raise VideoError(
            f"video frames of {width}x{height} pixels exceed the limit of "
            f"{limits.max_pixels_per_frame} pixels per frame"
        )


@dataclass(frozen=True)
class _Header:
    width: int
    height: int
    fps: float
    duration: float
    total_frames: int


def _decode_checked(
    data: bytes, settings: VideoSettings, limits: VideoLimits
) -> tuple[np.ndarray, float, np.ndarray, float]:
    """``decode_video``, where any failure inside the decoding library is the file's fault."""
    try:
        return decode_video(data, settings, limits)
    except VideoError:
        raise
    except (ValueError, TypeError, OSError, RuntimeError, IndexError, AttributeError) as exc:
        logger.info("video decoding failed: %r", exc)
        raise VideoError("cannot decode video: the file is malformed") from None


def decode_video(
    data: bytes, settings: VideoSettings, limits: VideoLimits
) -> tuple[np.ndarray, float, np.ndarray, float]:
    """(kept frames at native size, (n, H, W, 3) uint8; their sampling rate; their indices in
    the stream; the stream's frame rate)."""
    import av

    try:
        container = av.open(io.BytesIO(data), mode="r", metadata_errors="ignore")
    except (av.FFmpegError, ValueError, OSError) as exc:
        raise VideoError("cannot decode video: not a supported video format") from exc
    with container:
        if not container.streams.video:
            raise VideoError("cannot decode video: the file has no video stream")
        stream = container.streams.video[0]
        header = _header(container, stream, limits)
        indices = sample_indices(header.total_frames, header.fps, settings)
        if len(indices) == 0:
            raise VideoError(
                f"the video has {header.total_frames} frame(s): too few for the model "
                f"(at least {settings.min_frames_kept})"
            )
        kept_bytes = len(indices) * header.width * header.height * 3
        if kept_bytes > limits.max_decoded_bytes:
            raise VideoError(
                f"the video's {len(indices)} sampled frames of {header.width}x{header.height} "
                f"would take {kept_bytes >> 20} MiB, over the limit of "
                f"{limits.max_decoded_bytes >> 20} MiB"
            )
        frames = _decode_frames(container, stream, header, indices, limits)
    sampled_fps = len(indices) / header.total_frames * header.fps
    return frames, sampled_fps, indices, header.fps


def _header(container: Any, stream: Any, limits: VideoLimits) -> _Header:
    ctx = stream.codec_context
    if ctx is None:
        raise VideoError("cannot decode video: its video stream has no known codec")
    _check_frame_size(int(ctx.width or 0), int(ctx.height or 0), limits)
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    fps = float(rate) if rate else 0.0
    if not (math.isfinite(fps) and 0 < fps <= limits.max_fps):
        raise VideoError(
            f"the video's frame rate {fps:g} is outside (0, {limits.max_fps:g}] frames per second"
        )
    duration = 0.0
    if stream.duration and stream.time_base:
        duration = float(stream.duration * stream.time_base)
    elif container.duration:
        duration = container.duration / 1_000_000
    total = int(stream.frames or 0) or round(duration * fps)
    if not (math.isfinite(duration) and duration <= limits.max_duration_s):
        raise VideoError(
            f"the video lasts {duration:g} s, over the limit of {limits.max_duration_s:g} s"
        )
    if total <= 0:
        raise VideoError("the video's header gives neither its frame count nor its duration")
    if total > limits.max_frames:
        raise VideoError(f"the video has {total} frames, over the limit of {limits.max_frames}")
    return _Header(int(ctx.width), int(ctx.height), fps, duration, total)


def _decode_frames(
    container: Any, stream: Any, header: _Header, indices: np.ndarray, limits: VideoLimits
) -> np.ndarray:
    """The frames at ``indices`` (sorted): a frame's index is its time times the frame rate
    (its decode order where it has no time). Before a kept frame more than ``SEEK_GAP_S``
    ahead, seeks to the keyframe before it, then decodes forward to it."""
    import av

    wanted = [int(i) for i in indices]
    out: list[np.ndarray] = []
    start = float(stream.start_time * stream.time_base) if stream.start_time else 0.0
    gap = SEEK_GAP_S * header.fps
    counter, decoded = -1, 0
    budget = _DecodeBudget(limits, header.width * header.height)
    try:
        while len(out) < len(wanted):
            target = wanted[len(out)]
            if stream.time_base and target - max(counter, 0) > gap:
                seconds = start + target / header.fps
                container.seek(int(seconds / stream.time_base), stream=stream, backward=True)
                counter = -1
            found = len(out)
            for frame in container.decode(stream):
                decoded += 1
                if decoded > limits.max_frames:
                    raise VideoError("the video has more frames than its header declares")
                budget.spend()
                if (frame.width, frame.height) != (header.width, header.height):
                    raise VideoError("the video changes its frame size mid-stream")
                counter = _frame_index(frame, start, header.fps, counter)
                while len(out) < len(wanted) and wanted[len(out)] <= counter:
                    out.append(frame.to_ndarray(format="rgb24"))
                # seek again only after reaching the frame this pass was for
                if len(out) == len(wanted) or (
                    len(out) > found and wanted[len(out)] - counter > gap
                ):
                    break
            if len(out) == found:
                break  # the stream ended before the frame
    except av.FFmpegError as exc:
        raise VideoError("cannot decode video: the stream is corrupt or truncated") from exc
    if len(out) < len(wanted):
        raise VideoError(
            f"the video ended after {len(out)} of its {len(wanted)} sampled frames: the file "
            "is truncated or its header overstates its length"
        )
    return np.stack(out)


class _DecodeBudget:
    """Pixels decoded and time spent on one video, against the limits."""

    def __init__(self, limits: VideoLimits, frame_pixels: int) -> None:
        self.limits = limits
        self.frame_pixels = frame_pixels
        self.pixels = 0
        self.deadline = time.monotonic() + limits.max_decode_seconds

    def spend(self) -> None:
        self.pixels += self.frame_pixels
        if self.pixels > self.limits.max_decoded_pixels:
            raise VideoError(
                f"decoding the video would take more than {self.limits.max_decoded_pixels} "
                "pixels of frames"
            )
        if time.monotonic() > self.deadline:
            raise VideoError(
                f"decoding the video takes more than {self.limits.max_decode_seconds:g} s"
            )


def _frame_index(frame: Any, start: float, fps: float, previous: int) -> int:
    if frame.pts is None or frame.time_base is None:
        return previous + 1
    index = round((float(frame.pts * frame.time_base) - start) * fps)
    return max(index, previous + 1) if previous >= 0 else index
