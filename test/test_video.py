"""Video for Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3.5: greedy outputs equal HF ``generate``
given the same ``pixel_values_videos`` / ``video_grid_thw`` (and ``second_per_grid_ts``; Qwen3's
timestamps in the prompt), float32, for the whole prompt, chunks that cut through frame groups,
a cached prefix, a batch with an image request and a second turn about the same clip (which
encodes nothing); swapping two frame groups' cached embeddings is caught. Preprocessing is
checked against HF's video processor where torchvision imports, and against itself group by
group everywhere."""

from __future__ import annotations

import functools
import importlib.util
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers
from conftest import examples, hf_greedy, make_image, model_dir
from fixtures.video_reference import CASES as VIDEO_CASES
from fixtures.video_reference import case_id, describe
from fixtures.video_reference import clip as reference_clip
from fixtures.video_reference import hf_processor as video_hf_processor
from fixtures.video_reference import load_reference as load_video_reference
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from transformers.video_utils import VideoMetadata

import sglang
from sglang.srt.core.mm_item import sub_spans
from sglang.srt.multimodal.embedder import EncoderStats
from sglang.srt.multimodal.frame_groups import frame_groups
from sglang.srt.multimodal.hf_processor import load_hf_processor
from sglang.srt.multimodal.video_io import load_video
from sglang.srt.multimodal.video_preprocess import (
    VideoSettings,
    preprocess_frames,
    resize_frames,
    resized_size,
    sample_indices,
)

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5")
MAX_NEW = 6
GREEDY = {"temperature": 0, "max_new_tokens": MAX_NEW}
VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


def chat(*turns: str) -> str:
    """A Qwen chat prompt of user turns (assistant answers given inline) ending in an
    assistant turn."""
    text = "".join(f"<|im_start|>user\n{t}<|im_end|>\n<|im_start|>assistant\n" for t in turns)
    return text


PROMPT = chat(f"{VIDEO}What happens in the clip?")


def clip(seed: int, frames: int = 7, height: int = 50, width: int = 70) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (frames, height, width, 3), np.uint8)


@functools.cache
def _engine(family: str) -> sglang.Engine:
    return sglang.Engine(dtype="float32", model_path=model_dir(family), chunked_prefill_size=-1)


@functools.cache
def _hf_model(family: str):
    path = model_dir(family)
    model = transformers.AutoModelForImageTextToText.from_pretrained(
        path, dtype=torch.float32, attn_implementation="sdpa"
    )
    return model.eval()


def _reset(engine: sglang.Engine, chunk: int) -> None:
    engine.scheduler.chunk_size = None if chunk == -1 else chunk
    assert engine.scheduler.flush_cache()
    engine.scheduler.runner.embedder.stats = EncoderStats()


def hf_video_greedy(
    family: str, prompt: str, frames: np.ndarray, swap: tuple[int, int] | None = None
) -> tuple[list[int], list[float], list[int]]:
    """HF ``generate`` on the prompt expanded by HF's processor (its ``replace_video_token``:
    pads, and Qwen3-VL's per-group timestamps from the frames' metadata) with the video's
    features: (output ids, their log-probs, prompt ids)."""
    path = model_dir(family)
    settings = VideoSettings.from_model_dir(path)
    video = load_video(frames, settings)
    features = preprocess_frames(video.frames, settings)
    grid = features["video_grid_thw"]
    model = _hf_model(family)
    ids = torch.tensor([_hf_expanded_ids(family, prompt, grid, len(frames), settings.fps)])
    kwargs = {
        "pixel_values_videos": torch.from_numpy(features["pixel_values_videos"]),
        "video_grid_thw": torch.from_numpy(grid),
        "mm_token_type_ids": (ids == model.config.video_token_id).int() * 2,
    }
    if family == "qwen2_5_vl":
        kwargs["second_per_grid_ts"] = torch.tensor(
            [settings.temporal_patch_size / video.sampled_fps]
        )
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=MAX_NEW,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            **kwargs,
        )
    new = out.sequences[0, ids.shape[1] :].tolist()
    logprobs = [float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(out.logits, new)]
    return new, logprobs, ids[0].tolist()


def _hf_expanded_ids(
    family: str,
    prompt: str,
    grid: np.ndarray,
    frames: int,
    fps: float,
    indices: list[int] | None = None,
) -> list[int]:
    processor = load_hf_processor(model_dir(family))
    # built without a video processor (torchvision): the replacement reads these two only
    processor.video_processor = SimpleNamespace(merge_size=2, temporal_patch_size=2)
    indices = list(range(frames)) if indices is None else [int(i) for i in indices]
    metadata = VideoMetadata(total_num_frames=frames, fps=fps, frames_indices=indices)
    inputs = {"video_grid_thw": grid, "video_metadata": [metadata]}
    text = prompt.replace("<|video_pad|>", processor.replace_video_token(inputs, 0))
    return processor.tokenizer(text)["input_ids"]


@functools.cache
def _ref(family: str, prompt: str, seed: int, shape: tuple[int, int, int] = (7, 50, 70)):
    return hf_video_greedy(family, prompt, clip(seed, *shape))


def _matches(out: dict, ref: tuple) -> bool:
    ids, logprobs = ref[0], ref[1]
    got = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
    return out["output_ids"] == ids and np.allclose(got, logprobs, atol=2e-4, rtol=0)


def _generate(engine: sglang.Engine, prompt, **kwargs) -> dict:
    return engine.generate(prompt, GREEDY, return_logprob=True, **kwargs)


def _stats(engine: sglang.Engine):
    return engine.scheduler.runner.embedder.stats


# Preprocessing -------------------------------------------------------------------------------
def _preprocessed(family: str, frames: int, height: int, width: int) -> dict[str, np.ndarray]:
    """Our preprocessing of a reference case's clip, as a request's video goes through it."""
    settings = VideoSettings.from_model_dir(model_dir(family))
    video = load_video(reference_clip(frames + height + width, frames, height, width), settings)
    return preprocess_frames(video.frames, settings)


@pytest.mark.parametrize("case", VIDEO_CASES, ids=lambda case: case_id(*case))
def test_preprocess_equals_recorded_hf_output(case) -> None:
    """Bit for bit what HF's video processor (on torchvision) made of the clip, recorded in
    ``fixtures/video_preprocess_hf.json`` by ``fixtures/video_reference.py``."""
    want = load_video_reference()[case_id(*case)]
    got = {key: describe(value) for key, value in _preprocessed(*case).items()}
    assert set(got) == set(want)
    for key, mine in got.items():
        assert (mine["shape"], mine["dtype"]) == (want[key]["shape"], want[key]["dtype"]), key
        differing = {i: (v, mine["samples"][i]) for i, v in want[key]["samples"].items()
                     if mine["samples"][i] != v}  # fmt: skip
        assert mine["sha256"] == want[key]["sha256"], f"{key}: samples (HF, ours) {differing}"


@pytest.mark.skipif(
    importlib.util.find_spec("torchvision") is None, reason="HF's video processor needs torchvision"
)
@pytest.mark.parametrize("case", VIDEO_CASES, ids=lambda case: case_id(*case))
def test_preprocess_equals_hf_video_processor(case) -> None:
    """The same against HF's processor itself, where torchvision imports."""
    family, frames, height, width = case
    video = reference_clip(frames + height + width, frames, height, width)
    want = video_hf_processor(family, model_dir(family))(videos=[video], return_tensors="np")
    got = _preprocessed(*case)
    assert set(got) == set(want.keys())
    for key, value in got.items():
        np.testing.assert_array_equal(value, want[key])


@pytest.mark.parametrize("num_frames", [2, 5, 8])
def test_frame_groups_preprocess_alone(num_frames: int) -> None:
    """A frame group preprocessed from its own frames is its rows of the whole video
    (the last group padded by repeating the last frame, as for the whole)."""
    settings = VideoSettings.from_model_dir(model_dir("qwen2_vl"))
    frames = load_video(clip(num_frames, num_frames, 64, 90), settings).frames
    whole = preprocess_frames(frames, settings)["pixel_values_videos"]
    t = settings.temporal_patch_size
    groups = [preprocess_frames(frames[g : g + t], settings) for g in range(0, num_frames, t)]
    assert all(g["video_grid_thw"][0, 0] == 1 for g in groups)
    np.testing.assert_array_equal(np.concatenate([g["pixel_values_videos"] for g in groups]), whole)


def test_sampling_and_resize_rules() -> None:
    """HF's Qwen2-VL rules: fps sampling floored to whole frame groups and clamped by
    min / max frames; one size for every frame within the video pixel bounds."""
    s = VideoSettings(fps=2.0, min_frames=4, max_frames=768)
    # 10 s at 30 fps -> 20 frames, evenly spread
    np.testing.assert_array_equal(sample_indices(300, 30.0, s), np.arange(0, 300, 15))
    assert len(sample_indices(300, 30.0, VideoSettings(max_frames=12))) == 12
    assert len(sample_indices(9, 30.0, s)) == 4  # min_frames wins over 0.6 frames
    assert len(sample_indices(1, 30.0, s)) == 0  # not one frame group
    h, w = resized_size(8, 480, 640, s)
    assert h % 28 == w % 28 == 0 and h * w <= s.max_pixels
    frames = clip(0, 2, 30, 40)
    assert resize_frames(frames, (30, 40)) is frames
    assert resize_frames(frames, (28, 56)).shape == (2, 28, 56, 3)


def test_qwen3_sampling_and_resize_rules() -> None:
    """Qwen3-VL: ``round(linspace(0, total - 1, n))`` with n not floored to frame groups;
    the size bound is on frames x height x width."""
    s = VideoSettings(rule="qwen3_vl", fps=2.0, min_frames=4, max_frames=768)
    np.testing.assert_array_equal(
        sample_indices(50, 10.0, s), [0, 5, 11, 16, 22, 27, 33, 38, 44, 49]
    )
    assert len(sample_indices(9, 30.0, s)) == 4
    s = VideoSettings(rule="qwen3_vl", patch_size=16, min_pixels=2048, max_pixels=32 * 32 * 64)
    assert resized_size(8, 50, 70, s) == (64, 64)  # 8 x 64 x 64 = 32768 within the bound
    assert resized_size(40, 50, 70, s) == (32, 32)  # 40 frames: scaled down to one block
    assert resized_size(4, 10, 20, s) == (32, 64)  # smaller than a block: scaled up first


def _on_device(features: dict[str, np.ndarray], device: str) -> dict[str, torch.Tensor]:
    """The move ``_move_items_to_device`` makes before the tower runs (model code moves none)."""
    return {k: torch.from_numpy(v).to(device) for k, v in features.items()}


@pytest.mark.parametrize("family", FAMILIES)
def test_group_encoding_equals_whole(family: str) -> None:
    """The vision tower's output for a frame group alone equals its rows of the whole video."""
    engine = _engine(family)
    runner = engine.scheduler.runner
    settings = runner.embedder.preprocess.video_settings
    frames = load_video(clip(3, 8, 60, 60), settings).frames
    whole = preprocess_frames(frames, settings)
    rows = int(np.prod(whole["video_grid_thw"])) // settings.merge_size**2
    (full,) = runner.adapter.encode_videos([_on_device(whole, runner.device)], [rows])
    per_group = rows // int(whole["video_grid_thw"][0, 0])
    for g in range(4):
        part = preprocess_frames(frames[2 * g : 2 * g + 2], settings)
        (one,) = runner.adapter.encode_videos([_on_device(part, runner.device)], [per_group])
        torch.testing.assert_close(
            one.embedding, full.embedding[g * per_group : (g + 1) * per_group], atol=1e-5, rtol=0
        )


@settings(max_examples=examples(50), deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=5),
    gaps=st.lists(st.integers(0, 4), min_size=5, max_size=5),
    rows=st.integers(1, 6),
)
def test_group_spans_partition_the_video(lengths: list[int], gaps: list[int], rows: int) -> None:
    """Frame groups' spans, in order, are exactly the video's placeholder positions, each
    group ``rows`` of them (however separator tokens break the video's runs)."""
    spans, pos = [], 0
    for length, gap in zip(lengths, gaps):
        pos += gap
        spans.append((pos, pos + length))
        pos += length
    total = sum(lengths) - sum(lengths) % rows
    assume(total > 0)  # a video has at least one whole group
    positions = [p for start, end in spans for p in range(start, end)][:total]
    groups = [sub_spans(spans, g, g + rows) for g in range(0, total, rows)]
    assert [p for group in groups for s, e in group for p in range(s, e)] == positions
    assert all(sum(e - s for s, e in group) == rows for group in groups)


def test_families_without_video_refuse_it() -> None:
    engine = sglang.Engine(dtype="float32", model_path=model_dir("llava"))
    with pytest.raises(ValueError, match="does not accept videos"):
        engine.generate("USER: <image> hi", GREEDY, video_data=clip(0))


# Parity with HF ------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_whole_prompt_matches_hf(family: str) -> None:
    engine = _engine(family)
    _reset(engine, -1)
    ref = _ref(family, PROMPT, 1)
    tokenized, _ = engine.tokenize(PROMPT, GREEDY, None, None, None, clip(1))
    assert tokenized[0].input_ids == ref[2], "video placeholder expansion differs from HF's"
    out = _generate(engine, PROMPT, video_data=clip(1))
    assert _matches(out, ref)
    engine.scheduler.check_integrity()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("chunk", [5, 16])
def test_chunks_through_frame_groups_match_hf(family: str, chunk: int) -> None:
    """Chunks that end inside frame groups: each group is encoded once, by the first chunk
    that reaches it, and never more than the groups a chunk overlaps."""
    engine = _engine(family)
    _reset(engine, chunk)
    out = _generate(engine, PROMPT, video_data=clip(1))
    assert _matches(out, _ref(family, PROMPT, 1))
    stats = _stats(engine)
    rows = 4  # per frame group: 2x2 merged patches of 56x56 frames; 4 groups
    assert stats.encoded_tokens == 4 * rows
    assert len(engine.scheduler.runner.embedder.cache) == 4  # one entry per frame group
    assert stats.max_call_tokens <= rows * (-(-(chunk - 1) // rows) + 1)
    if chunk == 5:
        assert stats.encoder_calls >= 3
    engine.scheduler.check_integrity()


def test_whole_video_mode_matches_hf_and_encodes_at_once() -> None:
    """``--mm-video-cache whole``: one entry per video, encoded by the first chunk that
    touches it; the same outputs."""
    engine = sglang.Engine(
        dtype="float32",
        model_path=model_dir("qwen2_5_vl"),
        chunked_prefill_size=5,
        mm_video_cache="whole",
    )
    out = _generate(engine, PROMPT, video_data=clip(1))
    assert _matches(out, _ref("qwen2_5_vl", PROMPT, 1))
    stats = _stats(engine)
    assert (stats.encoder_calls, stats.encoded_tokens, stats.max_call_tokens) == (1, 16, 16)
    assert len(engine.scheduler.runner.embedder.cache) == 1
    engine.scheduler.check_integrity()


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    chunk=st.integers(2, 40),
    frames=st.integers(2, 9),
    size=st.sampled_from([(50, 70), (90, 40), (64, 64)]),
    seed=st.integers(0, 50),
)
def test_random_chunk_boundaries_match_hf(chunk: int, frames: int, size, seed: int) -> None:
    family = "qwen2_5_vl"
    engine = _engine(family)
    _reset(engine, chunk)
    shape = (frames, *size)
    out = _generate(engine, PROMPT, video_data=clip(seed, *shape))
    assert _matches(out, _ref(family, PROMPT, seed, shape))
    engine.scheduler.check_integrity()


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_prefix_matches_hf(family: str) -> None:
    engine = _engine(family)
    _reset(engine, 16)
    ref = _ref(family, PROMPT, 2)
    first = _generate(engine, PROMPT, video_data=clip(2))
    encoded = _stats(engine).encoded_tokens
    second = _generate(engine, PROMPT, video_data=clip(2))
    assert first["meta_info"]["cached_tokens"] == 0
    assert second["meta_info"]["cached_tokens"] > 20
    assert _matches(first, ref) and _matches(second, ref)
    assert _stats(engine).encoded_tokens == encoded  # the cached prefix covers the video


def test_batched_with_image_request_matches_hf() -> None:
    family = "qwen2_5_vl"
    engine = _engine(family)
    _reset(engine, 16)
    image_prompt = chat(f"{IMAGE}Describe the picture.")
    image = make_image(5, 64, 48)
    outs = engine.generate(
        [PROMPT, image_prompt],
        GREEDY,
        image_data=[[], [image]],
        video_data=[[clip(3)], []],
        return_logprob=True,
    )
    assert _matches(outs[0], _ref(family, PROMPT, 3))
    assert _matches(outs[1], hf_greedy(family, image_prompt, [image], MAX_NEW))
    engine.scheduler.check_integrity()


@pytest.mark.parametrize("family", FAMILIES)
def test_second_turn_encodes_nothing(family: str) -> None:
    engine = _engine(family)
    _reset(engine, 16)
    first = _generate(engine, PROMPT, video_data=clip(4))
    assert _matches(first, _ref(family, PROMPT, 4))
    stats = _stats(engine)
    calls, tokens = stats.encoder_calls, stats.encoded_tokens
    turn2 = PROMPT + first["text"] + "<|im_end|>\n" + chat("And then?")
    second = _generate(engine, turn2, video_data=clip(4))
    assert _matches(second, _ref(family, turn2, 4))
    assert (stats.encoder_calls, stats.encoded_tokens) == (calls, tokens)
    assert (
        second["meta_info"]["cached_tokens"]
        >= len(engine.tokenize(PROMPT, GREEDY, None, None, None, clip(4))[0][0].input_ids) - 1
    )


def test_swapped_frame_groups_are_caught() -> None:
    """The deliberate error: the cached embeddings of frame groups 0 and 1 trade places; the
    parity check then fails (output ids or log-probs differ from HF)."""
    family = "qwen2_5_vl"
    engine = _engine(family)
    _reset(engine, -1)
    ref = _ref(family, PROMPT, 1)
    assert _matches(_generate(engine, PROMPT, video_data=clip(1)), ref)
    (tokenized,), _ = engine.tokenize(PROMPT, GREEDY, None, None, None, clip(1))
    g0, g1 = frame_groups(tokenized.mm_items[0], 2)[:2]
    cache = engine.scheduler.runner.embedder.cache
    entries = cache._entries
    entries[g0.hash], entries[g1.hash] = entries[g1.hash], entries[g0.hash]
    scheduler = engine.scheduler
    scheduler.kv_pool.free(scheduler.tree.held_slots())
    scheduler.tree.reset()  # the prompt's KV goes, the swapped embeddings stay
    swapped = _generate(engine, PROMPT, video_data=clip(1))
    assert not _matches(swapped, ref)
    assert engine.scheduler.flush_cache()
