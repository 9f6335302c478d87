"""Small video files for tests and benchmarks, encoded with PyAV from given frames."""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np


def random_frames(seed: int, frames: int, height: int, width: int) -> np.ndarray:
    """Smooth-ish random frames (a random image drifting by a pixel per frame), so that video
    codecs keep them recognisable."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (height, width + frames, 3), dtype=np.uint8)
    return np.stack([base[:, i : i + width] for i in range(frames)])


def encode_clip(
    frames: np.ndarray,
    fps: float = 10.0,
    container: str = "mp4",
    codec: str = "libx264",
    gop: int = 10,
) -> bytes:
    """(n, H, W, 3) uint8 frames as an encoded video file (even H and W for yuv420p)."""
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.codec_context.gop_size = gop
        if codec == "libx264":
            stream.options = {"preset": "ultrafast"}
        for pixels in frames:
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def empty_clip(container: str = "mp4") -> bytes:
    """A file with a video stream and no frames."""
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream = out.add_stream("libx264", rate=10)
        stream.width, stream.height = 32, 32
        stream.pix_fmt = "yuv420p"
    return buf.getvalue()


def decode_all(data: bytes) -> np.ndarray:
    """Every frame of an encoded video, in order (a reference for sampled decoding)."""
    import av

    with av.open(io.BytesIO(data)) as inp:
        return np.stack([f.to_ndarray(format="rgb24") for f in inp.decode(video=0)])
