"""The generic adapter's pieces: batching per-image features as HF processors batch them,
splitting encoder outputs per image, layouts that stand in for pixels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang.srt.models.adapters import FAMILY_ADAPTERS, UnsupportedModelError, get_adapter
from sglang.srt.models.adapters.base import (
    PixelShape,
    batch_features,
    layout_inputs,
    layout_of,
    same_layout,
    split_rows,
)


def test_batch_features_pads_trailing_dims_and_stacks_images() -> None:
    a = {"pixel_values": torch.ones(1, 2, 3), "image_sizes": torch.tensor([[4, 5]])}
    b = {"pixel_values": torch.ones(1, 3, 2) * 2, "image_sizes": torch.tensor([[6, 7]])}
    out = batch_features([a, b], frozenset({"pixel_values", "image_sizes", "absent"}))
    assert set(out) == {"pixel_values", "image_sizes"}
    assert out["pixel_values"].shape == (2, 3, 3)
    assert out["pixel_values"][0, 2].abs().sum() == 0 and out["pixel_values"][0, :2, :3].eq(1).all()
    assert (
        out["pixel_values"][1, :, 2].abs().sum() == 0 and out["pixel_values"][1, :3, :2].eq(2).all()
    )
    assert out["image_sizes"].tolist() == [[4, 5], [6, 7]]


def test_batch_features_concatenates_per_view_arrays_of_the_images_that_have_them() -> None:
    with_tiles = {"pixel_values": torch.zeros(1, 3), "local": torch.ones(2, 3)}
    without = {"pixel_values": torch.zeros(1, 3)}
    out = batch_features([with_tiles, without, with_tiles], frozenset({"pixel_values", "local"}))
    assert out["pixel_values"].shape == (3, 3) and out["local"].shape == (4, 3)


def test_split_rows_per_image_list_or_flat_tiles() -> None:
    per_image = [torch.zeros(2, 4, 8), torch.ones(3, 8)]
    parts = split_rows(per_image, [8, 3])
    assert [p.shape for p in parts] == [(8, 8), (3, 8)]
    tiles = torch.arange(5 * 2 * 4, dtype=torch.float32).reshape(5, 2, 4)  # 5 tiles of 2 rows
    first, second = split_rows(tiles, [6, 4])
    assert torch.equal(first, tiles[:3].reshape(6, 4)) and torch.equal(
        second, tiles[3:].reshape(4, 4)
    )
    with pytest.raises(RuntimeError, match="rows"):
        split_rows(tiles, [6, 6])


def test_layout_keeps_pixel_shapes_only() -> None:
    features = {"pixel_values": np.ones((1, 3, 8, 8), np.float32), "num_patches": np.array([3])}
    layout = layout_of(features)
    assert layout["pixel_values"] == PixelShape((1, 3, 8, 8))
    inputs = layout_inputs(layout)
    assert inputs["pixel_values"].shape == (1, 3, 8, 8) and inputs["pixel_values"].strides == (
        0,
        0,
        0,
        0,
    )
    assert same_layout({"num_patches": np.array([3])}, layout)
    assert not same_layout({"num_patches": np.array([2])}, layout)


def test_unknown_vlm_family_is_refused_with_the_supported_list() -> None:
    class Config:
        model_type = "not_a_family"
        vision_config = object()

        def get_text_config(self):
            return self

    with pytest.raises(UnsupportedModelError) as err:
        get_adapter(None, Config())
    message = str(err.value)
    assert "\n" not in message and all(name in message for name in FAMILY_ADAPTERS)
