"""Video preprocessing of GLM-4.1V, LLaVA-OneVision and InternVL: against HF's video processor
where torchvision imports, and without it against the family's own transform applied per
frame; the families' frame sampling rules against HF's."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import model_dir
from transformers.video_utils import VideoMetadata
from video_families_reference import (
    FIXED_SIZE,
    HAS_TORCHVISION,
    SPECS,
    clip,
    video_settings,
)

from sglang.srt.multimodal.hf_processor import load_hf_processor
from sglang.srt.multimodal.video_io import load_video
from sglang.srt.multimodal.video_preprocess import VideoSettings, preprocess_frames


# Preprocessing (against HF's processors: test_video.py's recorded reference) -----------------
def test_glm4v_preprocess_is_qwen3_transform() -> None:
    """GLM-4.1V's video processor is Qwen3-VL's transform (its ``smart_resize`` on frames x
    height x width, the same patch layout) with GLM's own settings: equal to HF's GLM image
    processor on a two-frame group where the image rule agrees (one 56x56 frame group)."""
    from transformers.models.glm4v.video_processing_glm4v import smart_resize

    settings = video_settings("glm4v")
    for frames, height, width in [(7, 50, 70), (2, 30, 200), (40, 90, 60)]:
        want = smart_resize(
            frames,
            height,
            width,
            temporal_factor=2,
            factor=settings.factor,
            min_pixels=settings.min_pixels,
            max_pixels=settings.max_pixels,
        )
        video = load_video(clip(1, frames, height, width), settings)
        assert video.frames.shape[1:3] == want
    # Two identical frames: HF's image processor tiles one image the same way
    image = clip(5, 1, 56, 56)
    pair = np.repeat(image, 2, axis=0)
    processor = load_hf_processor(model_dir("glm4v"))
    want = processor.image_processor(
        images=[image[0]],
        return_tensors="np",
        size={"shortest_edge": 56 * 56, "longest_edge": 2 * 56 * 56},
    )
    got = preprocess_frames(pair, settings)
    np.testing.assert_array_equal(got["video_grid_thw"], want["image_grid_thw"])
    np.testing.assert_allclose(got["pixel_values_videos"], want["pixel_values"], atol=1e-6)


@pytest.mark.parametrize("family", [f for f in FIXED_SIZE if f in SPECS])
@pytest.mark.parametrize("size", [(28, 28), (50, 70)])
def test_frames_equal_the_image_transform_per_frame(family: str, size) -> None:
    """HF's video processor for these families is its base transform applied to every frame
    (resize to one fixed size, rescale, normalise): the family's image processor's own resize,
    rescale and normalise per frame give the same pixels. Equal up to float rounding where no
    resize happens; PIL's bicubic (the image processor) and torchvision's (the video
    processor, reproduced here) differ by at most a few uint8 steps where one does."""
    from transformers.image_processing_utils import SizeDict

    settings = video_settings(family)
    image_processor = load_hf_processor(model_dir(family)).image_processor
    frames = clip(7, 5, *size)
    got = preprocess_frames(load_video(frames, settings).frames, settings)
    got = got["pixel_values_videos"][0]
    target = SizeDict(height=settings.height, width=settings.width)
    want = []
    for frame in frames:
        chw = frame.transpose(2, 0, 1)
        chw = image_processor.resize(chw, target, resample=settings.resample)
        chw = image_processor.rescale(chw, settings.rescale_factor)
        want.append(image_processor.normalize(chw, settings.image_mean, settings.image_std))
    want = np.stack(want)
    assert got.shape == want.shape == (5, 3, settings.height, settings.width)
    step = settings.rescale_factor / min(settings.image_std)  # one uint8 step, normalised
    if size == (settings.height, settings.width):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    else:
        assert np.abs(got - want).max() <= 4 * step
        assert np.abs(got - want).mean() <= 0.5 * step


def test_glm4v_sampling_rule() -> None:
    """``Glm4vVideoProcessor.sample_frames``: ``fps`` frames a second at ``ceil(i * native /
    fps)``, an even count (last repeated); past ``max_duration`` spread by linspace."""
    from transformers.models.glm4v.video_processing_glm4v import Glm4vVideoProcessor

    from sglang.srt.multimodal.video_preprocess import sample_indices

    settings = video_settings("glm4v")
    for total, fps in [(300, 30.0), (25, 10.0), (7, 24.0), (9000, 25.0), (100, 2.0)]:
        metadata = VideoMetadata(total_num_frames=total, fps=fps, duration=total / fps)
        want = Glm4vVideoProcessor.sample_frames(SimpleNamespace(fps=2, max_duration=300), metadata)
        np.testing.assert_array_equal(sample_indices(total, fps, settings), want)


def test_uniform_sampling_rules() -> None:
    """LLaVA-OneVision: HF's ``default_sample_indices_fn`` (``arange(n) * total // n``);
    InternVL: its ``sample_frames`` (``arange(total / n / 2, total, total / n)``; its module
    imports torchvision, so its formula stands in where that is missing); ``num_frames`` else
    ``fps``, at most every frame (HF refuses more)."""
    from transformers.video_utils import default_sample_indices_fn

    def internvl_indices(metadata: VideoMetadata, count: int) -> np.ndarray:
        if HAS_TORCHVISION:
            from transformers.models.internvl.video_processing_internvl import (
                InternVLVideoProcessor,
            )

            shim = SimpleNamespace(num_frames=count, initial_shift=True)
            return InternVLVideoProcessor.sample_frames(shim, metadata).numpy()
        total = metadata.total_num_frames
        return torch.arange(total / count / 2, total, total / count).int().numpy()

    from sglang.srt.multimodal.video_preprocess import sample_indices

    llava, internvl = video_settings("llava_onevision"), video_settings("internvl")
    assert (llava.rule, llava.num_frames, internvl.rule, internvl.num_frames) == (
        "llava_onevision",
        32,
        "internvl",
        8,
    )
    for total, fps in [(300, 30.0), (33, 10.0), (9, 24.0), (1000, 25.0)]:
        metadata = VideoMetadata(total_num_frames=total, fps=fps)
        for count in (llava.num_frames, 8, 5):
            if count > total:
                continue
            s = VideoSettings(rule="llava_onevision", num_frames=count)
            want = default_sample_indices_fn(metadata, num_frames=count)
            np.testing.assert_array_equal(sample_indices(total, fps, s), want)
            s = VideoSettings(rule="internvl", num_frames=count)
            want = internvl_indices(metadata, count)
            np.testing.assert_array_equal(sample_indices(total, fps, s), want)
        s = VideoSettings(rule="llava_onevision", fps=1.0)
        want = default_sample_indices_fn(metadata, fps=1.0)
        np.testing.assert_array_equal(sample_indices(total, fps, s), want)
    assert len(sample_indices(5, 30.0, llava)) == 5  # 32 asked, 5 there
