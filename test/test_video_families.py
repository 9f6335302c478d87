"""Video for GLM-4.1V, LLaVA-OneVision and InternVL: greedy outputs equal HF ``generate`` given
the same video pixels (float32), for the whole prompt, chunks that cut through the video (and
its frame groups), a cached prefix, a batch with an image request and a second turn that
encodes nothing; a deliberate error (two frame groups' cached embeddings swapped, or the
video's frames reversed where the video is one item) breaks the equality. Placeholder text is
checked against HF's ``replace_video_token`` and positions against ``get_rope_index`` (through
``generate``). Preprocessing: ``test_video_preprocessing.py``."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import hf_greedy, make_image, model_dir
from video_families_reference import (
    FAMILIES,
    FIXED_SIZE,
    MAX_NEW,
    SPECS,
    clip,
    hf_video_greedy,
    prompt_of,
    video_prompt,
    video_settings,
)

import sglang
from sglang.srt.multimodal.embedder import EncoderStats
from sglang.srt.multimodal.frame_groups import frame_groups
from sglang.srt.multimodal.video_io import load_video
from sglang.srt.multimodal.video_preprocess import preprocess_frames

GREEDY = {"temperature": 0, "max_new_tokens": MAX_NEW}


@functools.cache
def _engine(family: str) -> sglang.Engine:
    return sglang.Engine(dtype="float32", model_path=model_dir(family), chunked_prefill_size=-1)


@functools.cache
def _ref(family: str, prompt: str, seed: int) -> tuple:
    return hf_video_greedy(family, prompt, clip(seed))


def _matches(out: dict, ref: tuple) -> bool:
    got = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
    return out["output_ids"] == ref[0] and np.allclose(got, ref[1], atol=2e-4, rtol=0)


def _reset(engine: sglang.Engine, chunk: int) -> None:
    engine.scheduler.chunk_size = None if chunk == -1 else chunk
    assert engine.scheduler.flush_cache()
    engine.scheduler.runner.embedder.stats = EncoderStats()


def _generate(engine: sglang.Engine, prompt: str, **kwargs) -> dict:
    return engine.generate(prompt, GREEDY, return_logprob=True, **kwargs)


def _stats(engine: sglang.Engine) -> EncoderStats:
    return engine.scheduler.runner.embedder.stats


def _separable(engine: sglang.Engine) -> bool:
    return engine.scheduler.runner.adapter.separable_video_groups


@pytest.mark.parametrize("family", FAMILIES)
def test_group_encoding_equals_whole(family: str) -> None:
    """Where the adapter declares frame groups separable, the tower's output for a group alone
    equals its rows of the whole video."""
    engine = _engine(family)
    if not _separable(engine):
        pytest.skip("the video is one item")
    runner = engine.scheduler.runner
    settings = runner.embedder.preprocess.video_settings
    video = load_video(clip(3, 8, 60, 60), settings)
    (tokenized,), _ = engine.tokenize(video_prompt(family), GREEDY, None, None, None, video)
    item = tokenized.mm_items[0]
    groups = frame_groups(item, settings.frames_per_group)

    def encode(frames: np.ndarray, rows: int) -> torch.Tensor:
        features = {k: torch.from_numpy(v) for k, v in preprocess_frames(frames, settings).items()}
        return runner.adapter.encode_videos([features], [rows])[0].embedding

    full = encode(video.frames, item.num_tokens)
    row = 0
    for group in groups:
        one = encode(group.source, group.num_tokens)
        torch.testing.assert_close(one, full[row : row + group.num_tokens], atol=1e-5, rtol=0)
        row += group.num_tokens
    assert row == item.num_tokens


# Parity with HF ------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_whole_prompt_matches_hf(family: str) -> None:
    engine = _engine(family)
    _reset(engine, -1)
    prompt = video_prompt(family)
    ref = _ref(family, prompt, 1)
    (tokenized,), _ = engine.tokenize(prompt, GREEDY, None, None, None, clip(1))
    assert tokenized.input_ids == ref[2], "video placeholder expansion differs from HF's"
    assert tokenized.mm_items[0].num_tokens == SPECS[family].rows
    out = _generate(engine, prompt, video_data=clip(1))
    assert _matches(out, ref)
    engine.scheduler.check_integrity()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("chunk", [5, 16])
def test_chunks_through_the_video_match_hf(family: str, chunk: int) -> None:
    """Chunks that end inside the video (and inside frame groups): every row is encoded once,
    one cache entry per frame group (or per video)."""
    engine = _engine(family)
    _reset(engine, chunk)
    prompt = video_prompt(family)
    out = _generate(engine, prompt, video_data=clip(1))
    assert _matches(out, _ref(family, prompt, 1))
    spec = SPECS[family]
    assert _stats(engine).encoded_tokens == spec.rows
    assert len(engine.scheduler.runner.embedder.cache) == spec.groups
    if spec.groups > 1 and chunk == 5:
        assert _stats(engine).encoder_calls >= 3  # groups encoded as chunks reach them
    engine.scheduler.check_integrity()


@pytest.mark.parametrize("family", FAMILIES)
def test_whole_video_mode_matches_hf(family: str) -> None:
    """``--mm-video-cache whole``: one entry per video (LLaVA-OneVision's newline included),
    encoded at once by the first chunk that touches it."""
    engine = sglang.Engine(
        dtype="float32",
        model_path=model_dir(family),
        chunked_prefill_size=5,
        mm_video_cache="whole",
    )
    prompt = video_prompt(family)
    assert _matches(_generate(engine, prompt, video_data=clip(1)), _ref(family, prompt, 1))
    rows = SPECS[family].rows
    stats = _stats(engine)
    assert (stats.encoder_calls, stats.encoded_tokens, stats.max_call_tokens) == (1, rows, rows)
    assert len(engine.scheduler.runner.embedder.cache) == 1
    engine.scheduler.check_integrity()


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_prefix_matches_hf(family: str) -> None:
    engine = _engine(family)
    _reset(engine, 16)
    prompt = video_prompt(family)
    ref = _ref(family, prompt, 2)
    first = _generate(engine, prompt, video_data=clip(2))
    encoded = _stats(engine).encoded_tokens
    second = _generate(engine, prompt, video_data=clip(2))
    assert first["meta_info"]["cached_tokens"] == 0
    assert second["meta_info"]["cached_tokens"] > SPECS[family].rows
    assert _matches(first, ref) and _matches(second, ref)
    assert _stats(engine).encoded_tokens == encoded


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_with_image_request_matches_hf(family: str) -> None:
    engine = _engine(family)
    _reset(engine, 16)
    prompt = video_prompt(family)
    image_prompt = prompt_of(family, SPECS[family].image + "Describe the picture.")
    image = make_image(5, 64, 48)
    outs = engine.generate(
        [prompt, image_prompt],
        GREEDY,
        image_data=[[], [image]],
        video_data=[[clip(3)], []],
        return_logprob=True,
    )
    assert _matches(outs[0], _ref(family, prompt, 3))
    assert _matches(outs[1], hf_greedy(family, image_prompt, [image], MAX_NEW))
    engine.scheduler.check_integrity()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("chunk", [-1, 7])
def test_image_and_video_in_one_prompt_match_hf(family: str, chunk: int) -> None:
    """An image, then a video, in one prompt: each owns its own rows (GLM-4.1V and InternVL
    write both with the image token; InternVL's pixels are the image's tiles then the
    frames)."""
    if family == "glm4v":
        pytest.skip(
            "HF's Glm4vModel.get_placeholder_mask takes every image token as both an image and "
            "a video row: HF cannot run both in one prompt (spans: test_glm4v_image_and_video_*)"
        )
    engine = _engine(family)
    _reset(engine, chunk)
    spec = SPECS[family]
    prompt = prompt_of(family, spec.image + "and" + spec.video + "What changed?")
    image = make_image(6, 64, 48)
    ref = hf_video_greedy(family, prompt, clip(5), (image,))
    (tokenized,), _ = engine.tokenize(prompt, GREEDY, None, [image], None, clip(5))
    assert tokenized.input_ids == ref[2]
    assert [item.modality for item in tokenized.mm_items] == ["image", "video"]
    out = _generate(engine, prompt, image_data=[image], video_data=clip(5))
    assert _matches(out, ref)
    engine.scheduler.check_integrity()


@pytest.mark.parametrize("family", FAMILIES)
def test_second_turn_encodes_nothing(family: str) -> None:
    engine = _engine(family)
    _reset(engine, 16)
    content = SPECS[family].video + "What happens in the clip?"
    prompt = prompt_of(family, content)
    first = _generate(engine, prompt, video_data=clip(4))
    assert _matches(first, _ref(family, prompt, 4))
    stats = _stats(engine)
    calls, tokens = stats.encoder_calls, stats.encoded_tokens
    turn2 = prompt_of(family, content, "And then?", answers=(first["text"],))
    second = _generate(engine, turn2, video_data=clip(4))
    assert _matches(second, _ref(family, turn2, 4))
    assert (stats.encoder_calls, stats.encoded_tokens) == (calls, tokens)
    assert second["meta_info"]["cached_tokens"] > SPECS[family].rows


@pytest.mark.parametrize("video_cache", ["per-group", "whole"])
@pytest.mark.parametrize("family", FAMILIES)
def test_deliberate_error_breaks_parity(family: str, video_cache: str) -> None:
    """The cached embeddings of frame groups 0 and 1 trade places (where the video is one
    item, ``--mm-video-cache whole``: its first and last rows do); the parity check then
    fails."""
    if video_cache == "whole":
        engine = sglang.Engine(
            dtype="float32", model_path=model_dir(family), chunked_prefill_size=-1,
            mm_video_cache="whole",
        )  # fmt: skip
    else:
        engine = _engine(family)
        _reset(engine, -1)
    prompt = video_prompt(family)
    ref = _ref(family, prompt, 1)
    assert _matches(_generate(engine, prompt, video_data=clip(1)), ref)
    (tokenized,), _ = engine.tokenize(prompt, GREEDY, None, None, None, clip(1))
    item = tokenized.mm_items[0]
    cache = engine.scheduler.runner.embedder.cache
    entries = cache._entries
    if engine.scheduler.runner.embedder._split_videos:
        assert video_cache == "per-group" and _separable(engine)
        g0, g1 = frame_groups(item, video_settings(family).frames_per_group)[:2]
        entries[g0.hash], entries[g1.hash] = entries[g1.hash], entries[g0.hash]
    else:
        assert video_cache == "whole"
        rows = entries[item.hash].embedding
        rows[[0, -2]] = rows[[-2, 0]]
    scheduler = engine.scheduler
    scheduler.kv_pool.free(scheduler.tree.held_slots())
    scheduler.tree.reset()  # the prompt's KV goes, the altered embeddings stay
    assert not _matches(_generate(engine, prompt, video_data=clip(1)), ref)
    assert engine.scheduler.flush_cache()


def test_glm4v_encoded_clip_writes_whole_seconds() -> None:
    """An encoded 3 s clip at 10 fps: GLM samples 2 frames a second (stream frames 0, 5, ...,
    25); each frame group is followed by the whole second of its first frame."""
    from sglang_dev.video_clips import encode_clip, random_frames

    engine = _engine("glm4v")
    data = encode_clip(random_frames(0, 30, 64, 64), fps=10.0)
    (tokenized,), _ = engine.tokenize(video_prompt("glm4v"), GREEDY, None, None, None, data)
    text = engine.scheduler.runner.tokenizer.decode(tokenized.input_ids)
    assert [text.count(f"<|end_of_image|>{s}<|begin") for s in (0, 1)] == [1, 1]
    assert "<|end_of_image|>2<|end_of_video|>" in text
    assert tokenized.mm_items[0].layout["video_grid_thw"][0][0] == 3


def test_glm4v_image_and_video_share_the_image_token() -> None:
    """GLM writes video frames with ``<|image|>``: in a prompt with an image before and after
    a video, each item owns its own image tokens (HF's token types: 2 inside the video)."""
    engine = _engine("glm4v")
    spec = SPECS["glm4v"]
    prompt = prompt_of("glm4v", spec.image + spec.video + "and" + spec.image)
    images = [make_image(1, 56, 56), make_image(2, 56, 56)]
    (tokenized,), _ = engine.tokenize(prompt, GREEDY, None, images, None, clip(1))
    kinds = [item.modality for item in tokenized.mm_items]
    assert kinds == ["image", "video", "image"]
    ids = np.asarray(tokenized.input_ids)
    types = engine.scheduler.runner.adapter.mm_token_types(ids)
    for item in tokenized.mm_items:
        for start, end in item.spans:
            assert set(types[start:end]) == {2 if item.modality == "video" else 1}
    assert sum(item.num_tokens for item in tokenized.mm_items) == int((types > 0).sum())


@pytest.mark.parametrize("family", [f for f in FIXED_SIZE if f in SPECS])
def test_encoded_clip_keeps_num_frames(family: str) -> None:
    """An encoded 3 s clip at 10 fps: InternVL keeps its 8 frames (``Frame1:`` ..
    ``Frame8:``), LLaVA-OneVision every one of the 30 (32 asked)."""
    from sglang_dev.video_clips import encode_clip, random_frames

    engine = _engine(family)
    data = encode_clip(random_frames(0, 30, 64, 64), fps=10.0)
    (tokenized,), _ = engine.tokenize(video_prompt(family), GREEDY, None, None, None, data)
    item = tokenized.mm_items[0]
    kept = 8 if family == "internvl" else 30
    assert item.layout["pixel_values_videos"][1] == kept
    if family == "internvl":
        text = engine.scheduler.runner.tokenizer.decode(tokenized.input_ids)
        assert "Frame8: <img>" in text and "Frame9" not in text
    assert item.num_tokens == SPECS[family].rows // 7 * kept + (family == "llava_onevision")


@pytest.mark.parametrize(
    "family, options, kept",
    [
        ("internvl", {"num_frames": 4}, 4),
        ("internvl", {"fps": 5.0}, 15),  # fps replaces the default frame count
        ("internvl", {"fps": 5.0, "max_frames": 6}, 6),
        ("llava_onevision", {"num_frames": 12}, 12),
        ("glm4v", {"fps": 1.0}, 4),  # seconds 0, 1, 2; the last repeated to an even count
    ],
)
def test_request_sampling_options(family: str, options: dict, kept: int) -> None:
    """``mm_processor_kwargs`` per request, by the family's sampling rule (3 s at 10 fps)."""
    from sglang_dev.video_clips import encode_clip, random_frames

    engine = _engine(family)
    data = encode_clip(random_frames(0, 30, 64, 64), fps=10.0)
    (tokenized,), _ = engine.tokenize(
        video_prompt(family), GREEDY, None, None, None, data, mm_processor_kwargs=options
    )
    layout = tokenized.mm_items[0].layout
    frames = layout["video_grid_thw"][0][0] * 2 if family == "glm4v" else None
    assert (frames or layout["pixel_values_videos"][1]) == kept
    if family == "glm4v":
        with pytest.raises(ValueError, match="takes fps"):
            engine.tokenize(video_prompt(family), GREEDY, None, None, None, data, {"max_frames": 4})


@pytest.mark.parametrize("family", FAMILIES)
def test_chat_video_part_renders_the_family_placeholder(family: str) -> None:
    """An OpenAI ``video_url`` part goes through the model's chat template to the family's
    video placeholder, and its options to the video's sampling."""
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.entrypoints.openai.serving_chat import render_chat as _render_chat
    from sglang.srt.server_args import ServerArgs

    engine = _engine(family)
    part = {"type": "video_url", "video_url": {"url": "clip.mp4", "fps": 1.0}}
    content = [part, {"type": "text", "text": "What happens?"}]
    body = ChatCompletionRequest(
        messages=[{"role": "user", "content": content}], mm_processor_kwargs={"fps": 2.0}
    )
    manager = SimpleNamespace(tokenizer=engine.tokenizer)
    prompt, images, videos, options = _render_chat(manager, body, ServerArgs())
    assert SPECS[family].video in prompt and (images, videos) == ([], ["clip.mp4"])
    assert options == [{"fps": 1.0}]
    (tokenized,), _ = engine.tokenize(prompt, GREEDY, None, None, None, clip(1))
    assert [item.modality for item in tokenized.mm_items] == ["video"]
