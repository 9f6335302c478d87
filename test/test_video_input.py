"""Video input: PyAV decoding keeps exactly the frames HF's sampling picks (seeking included),
encoded clips and their decoded frames give the same output, per-request limits, and malformed
videos get a clear error (Engine: ValueError; server: 400) while the server keeps serving."""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import os
import re
import threading

import httpx
import numpy as np
import pytest
from conftest import examples, model_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_utils import launch_server

import sglang
from sglang.srt.multimodal.video_io import VideoError, VideoLimits, load_video
from sglang.srt.multimodal.video_preprocess import (
    VideoSettings,
    resize_frames,
    resized_size,
    sample_indices,
)
from sglang_dev.video_clips import decode_all, empty_clip, encode_clip, random_frames

FAMILY = "qwen2_5_vl"
VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"
PROMPT = f"<|im_start|>user\n{VIDEO}What happens?<|im_end|>\n<|im_start|>assistant\n"
GREEDY = {"temperature": 0, "max_new_tokens": 4}


@functools.cache
def _clip(
    seed: int = 0, frames: int = 20, fps: float = 10.0, container: str = "mp4", gop: int = 10
) -> bytes:
    codec = "libx264" if container == "mp4" else "libvpx-vp9"
    return encode_clip(random_frames(seed, frames, 48, 64), fps, container, codec, gop)


# HF's Qwen2-VL sampling of a 200-frame, 10 fps clip (20 s), worked out by hand: duration x fps
# frames, a multiple of the temporal patch (2) and at least min_frames (4), at
# arange(0, total, total / n): 2 fps gives 40 frames 5 apart, 0.25 fps 5 -> 4 frames 50 apart.
SAMPLED = {2.0: np.arange(0, 200, 5), 0.25: np.arange(0, 200, 50)}


# 0.25 fps: kept frames 5 s apart, reached by seeking; gop 100: keyframes 10 s apart, so a
# seek lands far before its frame and decodes forward to it
@pytest.mark.parametrize("fps, gop", [(2.0, 10), (0.25, 10), (0.25, 100)])
def test_decoding_keeps_the_sampled_frames(fps: float, gop: int) -> None:
    settings = VideoSettings(min_pixels=56 * 56, max_pixels=112 * 112, fps=fps, max_frames=64)
    data = _clip(1, frames=200, gop=gop)
    video = load_video(data, settings)
    kept = decode_all(data)[SAMPLED[fps]]  # every frame decoded in order, then picked
    # the resize is checked against HF's processor in test_video.py
    want = resize_frames(kept, resized_size(len(kept), *kept.shape[1:3], settings))
    np.testing.assert_array_equal(video.frames, want)
    assert video.sampled_fps == pytest.approx(len(video.frames) / 20.0)


@functools.cache
def _engine(**flags) -> sglang.Engine:
    return sglang.Engine(model_path=model_dir(FAMILY), dtype="float32", **flags)


def test_encoded_clip_equals_its_decoded_frames() -> None:
    engine = _engine()
    data = _clip(2)
    frames = decode_all(data)
    settings = engine.processor.video_settings
    kept = frames[sample_indices(len(frames), 10.0, settings)]  # 2 s at 2 fps: 4 frames
    as_file = engine.generate(PROMPT, GREEDY, video_data=data)
    as_frames = engine.generate(PROMPT, GREEDY, video_data=kept)
    assert as_file["output_ids"] == as_frames["output_ids"]
    assert as_file["meta_info"]["prompt_tokens"] == as_frames["meta_info"]["prompt_tokens"]
    webm = engine.generate(PROMPT, GREEDY, video_data=_clip(2, container="webm"))
    assert webm["meta_info"]["prompt_tokens"] == as_file["meta_info"]["prompt_tokens"]


def test_qwen3_timestamps_follow_the_stream() -> None:
    """Qwen3-VL writes each frame group's time into the prompt: from the kept frames' indices
    in the stream and its frame rate, as HF's processor computes them from the metadata."""
    from test_video import _hf_expanded_ids

    family = "qwen3_vl"
    engine = sglang.Engine(dtype="float32", model_path=model_dir(family))
    data = _clip(10, frames=50)  # 5 s at 10 fps: 10 frames kept
    (tokenized,), _ = engine.tokenize(PROMPT, GREEDY, None, None, None, data)
    video = engine.processor.load_videos([data])[0]
    np.testing.assert_array_equal(video.indices, np.linspace(0, 49, 10).round())
    grid = tokenized.mm_items[0].layout["video_grid_thw"]
    expected = _hf_expanded_ids(family, PROMPT, grid, 50, 10.0, list(video.indices))
    assert tokenized.input_ids == expected
    assert f"<{(11 + 16) / 2 / 10:.1f} seconds>" in engine.tokenizer.decode(tokenized.input_ids)


def test_a_resent_clip_is_not_decoded_again(monkeypatch) -> None:
    from sglang.srt.multimodal import video_io

    engine = _engine()
    decoded = []
    decode = video_io.decode_video
    monkeypatch.setattr(video_io, "decode_video", lambda *a: decoded.append(1) or decode(*a))
    first = engine.processor.load_videos([_clip(11)])[0]
    again = engine.processor.load_videos([_clip(11)])[0]
    other = engine.processor.load_videos([_clip(12)])[0]
    assert again is first and other is not first and len(decoded) == 2
    assert not first.frames.flags.writeable


def test_request_sampling_options() -> None:
    """``mm_processor_kwargs`` (``fps``, ``max_frames``) change which frames a request keeps
    and so its item key; a clip decoded under other options is decoded again; options are
    bounded and named."""
    engine = _engine()
    clip = _clip(13, frames=50)  # 5 s at 10 fps
    counts = {}
    keys = set()
    for options in (None, {"fps": 1.0}, {"max_frames": 4}, {"fps": 4.0, "max_frames": 12}):
        (tokenized,), _ = engine.tokenize(
            PROMPT, GREEDY, None, None, None, clip, mm_processor_kwargs=options
        )
        item = tokenized.mm_items[0]
        counts[json.dumps(options)] = int(item.layout["video_grid_thw"][0][0]) * 2
        keys.add(item.hash)
    # 2 fps: 10 frames; 1 fps: 5, floored to whole groups; at most 4; 4 fps capped at 12
    assert list(counts.values()) == [10, 4, 4, 12]
    assert len(keys) == 4
    out = engine.generate(PROMPT, GREEDY, video_data=clip, mm_processor_kwargs={"fps": 1.0})
    assert (
        out["meta_info"]["prompt_tokens"]
        < engine.generate(PROMPT, GREEDY, video_data=clip)["meta_info"]["prompt_tokens"]
    )
    bad = [
        {"fps": 0},
        {"fps": 61},
        {"fps": float("nan")},
        {"fps": "2"},
        {"max_frames": 0},
        {"max_frames": 4096},
        {"max_frames": True},
        {"num_frames": 8},  # Qwen samples by rate, not by count
        {"bogus": 1},
    ]
    for options in bad:
        with pytest.raises(ValueError, match="video option|mm_processor_kwargs"):
            engine.generate(PROMPT, GREEDY, video_data=clip, mm_processor_kwargs=options)
    with pytest.raises(ValueError, match="mm_processor_kwargs must be an object"):
        engine.generate(PROMPT, GREEDY, video_data=clip, mm_processor_kwargs=[1])


def _bad_videos() -> dict[str, bytes]:
    """Malformed or abusive videos, each with its own reason to be refused."""
    good = _clip(3)
    webm = _clip(3, frames=40, container="webm")
    return {
        "not a video": b"\x00\x01 definitely not a video" * 100,
        "an image": base64.b64decode(
            "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
        ),
        "truncated mp4": good[: len(good) // 2],
        "truncated webm": webm[: len(webm) // 3],
        "header only": good[:600],
        "no frames": empty_clip(),
        "one frame": encode_clip(random_frames(4, 1, 32, 32)),
        "huge frames": encode_clip(np.zeros((2, 2304, 4096, 3), np.uint8), gop=1),
        "absurd frame rate": encode_clip(random_frames(5, 8, 32, 32), fps=1000),
        "absurd duration": encode_clip(random_frames(6, 700, 16, 16), fps=1, gop=250),
    }


@functools.cache
def _bad() -> dict[str, bytes]:
    return _bad_videos()


@pytest.mark.parametrize(
    "name",
    [
        "not a video",
        "an image",
        "truncated mp4",
        "truncated webm",
        "header only",
        "no frames",
        "one frame",
        "huge frames",
        "absurd frame rate",
        "absurd duration",
    ],
)
def test_malformed_video_is_a_value_error(name: str) -> None:
    engine = _engine()
    with pytest.raises(ValueError, match="video") as info:
        engine.generate(PROMPT, GREEDY, video_data=_bad()[name])
    assert isinstance(info.value, VideoError)
    assert not re.search(r"0x[0-9a-fA-F]{6,}", str(info.value))


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), min_size=1, max_size=8),
    cut=st.floats(0.05, 1.0),
    container=st.sampled_from(["mp4", "webm"]),
)
def test_corrupted_files_are_refused_or_decoded(flips, cut: float, container: str) -> None:
    """Random bytes overwritten and the file cut anywhere: a decoded video or a VideoError,
    never another exception."""
    data = bytearray(_clip(13, container=container))
    for where, value in flips:
        data[int(where * (len(data) - 1))] = value
    data = bytes(data[: max(1, int(len(data) * cut))])
    settings = VideoSettings(min_pixels=56 * 56, max_pixels=112 * 112)
    try:
        video = load_video(data, settings)
    except VideoError as exc:
        assert not re.search(r"0x[0-9a-fA-F]{6,}", str(exc))  # no memory addresses
    else:
        assert video.frames.ndim == 4 and len(video.frames) >= 1


def test_limits() -> None:
    settings = VideoSettings(min_pixels=56 * 56, max_pixels=112 * 112)
    data = _clip(7)
    cases = {
        "pixels per frame": VideoLimits(max_pixels_per_frame=1000),
        "MiB": VideoLimits(max_decoded_bytes=10_000),
        "lasts": VideoLimits(max_duration_s=1.0),
        "frames, over": VideoLimits(max_frames=10),
        "frame rate": VideoLimits(max_fps=5.0),
        "pixels of frames": VideoLimits(max_decoded_pixels=5 * 48 * 64),
        "takes more than": VideoLimits(max_decode_seconds=-1.0),
    }
    for message, limits in cases.items():
        with pytest.raises(VideoError, match=message):
            load_video(data, settings, limits=limits)
    with pytest.raises(VideoError, match="uint8 array"):
        load_video(np.zeros((4, 8, 8), np.float32), settings)


def test_per_request_video_limit_and_prompt_count() -> None:
    engine = _engine(limit_mm_data_per_request='{"image": 8, "video": 1}')
    clip = _clip(8)
    with pytest.raises(ValueError, match="2 videos in one request; the limit is 1"):
        engine.generate(PROMPT.replace(VIDEO, VIDEO * 2), GREEDY, video_data=[clip, clip])
    with pytest.raises(ValueError, match="video placeholder"):
        engine.generate("no placeholder here", GREEDY, video_data=clip)
    assert engine.generate(PROMPT, GREEDY, video_data=clip)["output_ids"]


def test_http_video_fetch_follows_the_image_rules() -> None:
    """An http(s) video is downloaded under the image bounds: refused at a private address by
    default, fetched when private addresses are allowed, refused over the size limit."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from sglang.srt.multimodal.image_io import ImageError
    from sglang.srt.multimodal.media_fetch import fetch_video_source
    from sglang.srt.server_args import ServerArgs

    clip = _clip(14)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Length", str(len(clip)))
            self.end_headers()
            self.wfile.write(clip)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/clip.mp4"
    try:
        with pytest.raises(ImageError, match="cannot fetch the video"):
            asyncio.run(fetch_video_source(url, ServerArgs().fetch_policy))
        allowed = ServerArgs(allow_private_media_urls=True).fetch_policy
        assert asyncio.run(fetch_video_source(url, allowed)) == clip
        tiny = ServerArgs(allow_private_media_urls=True, media_url_max_file_size_mb=0).fetch_policy
        with pytest.raises(ImageError, match="cannot fetch the video"):
            asyncio.run(fetch_video_source(url, tiny))
    finally:
        server.shutdown()


# Server -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    media = tmp_path_factory.mktemp("media")
    (media / "clip.mp4").write_bytes(_clip(9))
    limits = json.dumps({"image": 8, "video": 1})
    flags = ("--limit-mm-data-per-request", limits, "--allowed-local-media-path", str(media))
    with launch_server(model_dir(FAMILY), *flags) as (url, _):
        yield url, media


def _data_url(data: bytes) -> str:
    return "data:video/mp4;base64," + base64.b64encode(data).decode()


def _chat(url: str, video_url: str) -> httpx.Response:
    content = [
        {"type": "video_url", "video_url": {"url": video_url}},
        {"type": "text", "text": "?"},
    ]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 3, "temperature": 0}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)


def test_server_accepts_videos(server) -> None:
    url, media = server
    by_data = _chat(url, _data_url(_clip(9)))
    assert by_data.status_code == 200, by_data.text
    by_path = _chat(url, str(media / "clip.mp4"))
    assert by_path.status_code == 200, by_path.text
    assert by_path.json()["choices"][0]["message"] == by_data.json()["choices"][0]["message"]
    body = {"text": PROMPT, "video_data": _data_url(_clip(9)), "sampling_params": GREEDY}
    generated = httpx.post(f"{url}/generate", json=body, timeout=60)
    assert generated.status_code == 200, generated.text


def test_server_takes_video_sampling_options(server) -> None:
    """``mm_processor_kwargs`` on chat and /generate and ``fps`` / ``max_frames`` in a
    ``video_url`` part (over the request's) change the frames kept; bad options are 400s."""
    url, _ = server
    data = _data_url(_clip(9))  # 2 s at 10 fps: 4 frames at the default 2 fps

    def chat_tokens(video_url: dict, **extra) -> int:
        content = [{"type": "video_url", "video_url": video_url}, {"type": "text", "text": "?"}]
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1, **extra}
        response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        return response.json()["usage"]["prompt_tokens"]

    default = chat_tokens({"url": data})
    assert chat_tokens({"url": data, "fps": 5.0}) > default
    more = chat_tokens({"url": data}, mm_processor_kwargs={"fps": 5.0})
    assert chat_tokens({"url": data, "max_frames": 4}, mm_processor_kwargs={"fps": 5.0}) == default
    assert more > default
    body = {"text": PROMPT, "video_data": data, "sampling_params": {"max_new_tokens": 1}}
    generated = httpx.post(
        f"{url}/generate", json={**body, "mm_processor_kwargs": {"fps": 5.0}}, timeout=60
    )
    assert (
        generated.status_code == 200
        and generated.json()["meta_info"]["prompt_tokens"]
        > (
            httpx.post(f"{url}/generate", json=body, timeout=60).json()["meta_info"][
                "prompt_tokens"
            ]
        )
    )
    for extra in ({"mm_processor_kwargs": {"fps": -1}}, {"mm_processor_kwargs": {"bogus": 1}}):
        content = [{"type": "video_url", "video_url": {"url": data}}]
        body = {"messages": [{"role": "user", "content": content}], **extra}
        response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        assert response.status_code == 400 and "video option" in response.text, response.text
    bad = {"text": PROMPT, "video_data": data, "mm_processor_kwargs": {"max_frames": 0}}
    assert httpx.post(f"{url}/generate", json=bad, timeout=60).status_code == 400


def test_server_refuses_malformed_videos_and_keeps_serving(server) -> None:
    url, _ = server
    probes = {name: _data_url(data) for name, data in _bad().items()}
    probes |= {
        "invalid base64": "data:video/mp4;base64,@@@not-base64@@@",
        "data URL without base64": "data:video/mp4,abc",
        "path outside the allowed directory": "/etc/hostname",
        "private address": "http://127.0.0.1:1/clip.mp4",
        "unsupported scheme": "ftp://example.com/clip.mp4",
    }
    answers = {}
    for name, ref in probes.items():
        response = _chat(url, ref)
        answers[name] = response.status_code
        assert response.status_code == 400, (name, response.text)
        assert "video" in response.json()["error"]["message"] or "base64" in response.text
    two = {
        "text": PROMPT.replace(VIDEO, VIDEO * 2),
        "video_data": [_data_url(_clip(9))] * 2,
        "sampling_params": GREEDY,
    }
    too_many = httpx.post(f"{url}/generate", json=two, timeout=60)
    assert too_many.status_code == 400 and "limit is 1" in too_many.text
    assert len(answers) >= 12
    assert httpx.get(f"{url}/health_generate", timeout=30).status_code == 200
    assert _chat(url, _data_url(_clip(9))).status_code == 200
    if os.environ.get("SGLANG_PRINT_PROBES"):
        print(json.dumps(answers, indent=1))
