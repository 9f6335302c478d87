"""The fast Qwen-VL preprocessing path is bit-identical to the HF PIL image processor."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import examples, model_dir
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from sglang.srt.multimodal import fast_preprocess
from sglang.srt.multimodal.hf_processor import load_hf_processor

QWEN_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def _image_processor(family: str):
    return load_hf_processor(model_dir(family)).image_processor


def _random_image(seed: int, width: int, height: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _assert_bit_identical(processor, images: list[Image.Image]) -> None:
    assert fast_preprocess.supports(processor, images)
    ref = processor(images=images, return_tensors="np")
    got = fast_preprocess.preprocess(processor, images)
    assert got["pixel_values"].dtype == ref["pixel_values"].dtype
    assert got["pixel_values"].shape == ref["pixel_values"].shape
    assert got["pixel_values"].tobytes() == ref["pixel_values"].tobytes()
    assert np.array_equal(got["image_grid_thw"], ref["image_grid_thw"])


@pytest.mark.parametrize("family", QWEN_FAMILIES)
@settings(max_examples=examples(12), deadline=None)
@given(
    width=st.integers(28, 700),
    height=st.integers(28, 700),
    seed=st.integers(0, 2**16),
)
def test_bit_identical_to_hf_on_random_images(family: str, width: int, height: int, seed: int):
    _assert_bit_identical(_image_processor(family), [_random_image(seed, width, height)])


def test_bit_identical_on_a_batch_and_real_pixel_range() -> None:
    """A batch of differently sized images, through the benchmark model's processor settings
    (Qwen's real pixel range: large images are resized down, small ones up)."""
    processor = _image_processor("qwen2_5_vl")
    processor.size = {"shortest_edge": 56 * 56, "longest_edge": 16384 * 28 * 28}
    sizes = [(1280, 720), (33, 250), (640, 360), (1000, 29)]
    _assert_bit_identical(processor, [_random_image(i, w, h) for i, (w, h) in enumerate(sizes)])


def test_other_modes_and_processors_fall_back() -> None:
    processor = _image_processor("qwen2_5_vl")
    assert not fast_preprocess.supports(processor, [Image.new("L", (64, 64))])
    assert not fast_preprocess.supports(_image_processor("llava"), [Image.new("RGB", (64, 64))])


@pytest.mark.parametrize("family", QWEN_FAMILIES)
def test_the_engine_takes_the_fast_path_with_identical_features(family: str) -> None:
    from transformers import AutoConfig

    from sglang.srt.multimodal.processor import MultimodalProcessor

    path = model_dir(family)
    pre = MultimodalProcessor(path, AutoConfig.from_pretrained(path)).preprocessor
    assert pre.fast_path_ok
    image = _random_image(7, 300, 200)
    slow = pre.process(image)[0]  # the HF processor's own path
    (fast,) = pre.features([image])
    assert sorted(fast) == sorted(slow)
    assert fast["pixel_values"].tobytes() == slow["pixel_values"].tobytes()
    assert np.array_equal(fast["image_grid_thw"], slow["image_grid_thw"])
