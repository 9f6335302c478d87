"""Prompt + images -> expanded input ids and one ``MultimodalItem`` per image."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sglang.srt.models.adapters import get_adapter
from sglang.srt.multimodal.hf_processor import load_hf_processor
from sglang.srt.multimodal.image_io import LoadedImage, load_image
from sglang.srt.multimodal.items import MultimodalItem, spans_of


class MultimodalProcessor:
    def __init__(self, model_path: str, hf_config: Any, allowed_local_dir: str | None = "*"):
        self.hf_processor = load_hf_processor(model_path)
        self.tokenizer = getattr(self.hf_processor, "tokenizer", self.hf_processor)
        self.adapter = get_adapter(None, hf_config)  # type: ignore[arg-type]
        self.is_multimodal = hasattr(hf_config, "vision_config")
        self.allowed_local_dir = allowed_local_dir

    def load_images(self, image_data: Sequence[Any]) -> list[LoadedImage]:
        return [load_image(src, self.allowed_local_dir) for src in image_data]

    def process(
        self,
        prompt: str | None,
        input_ids: list[int] | None,
        images: Sequence[LoadedImage],
    ) -> tuple[list[int], list[MultimodalItem]]:
        if not images:
            if input_ids is None:
                input_ids = self.tokenizer(prompt)["input_ids"]
            return list(input_ids), []
        if not self.is_multimodal:
            raise ValueError("this model does not accept images")
        if prompt is None:
            assert input_ids is not None
            prompt = self.tokenizer.decode(input_ids)
        processed = self.hf_processor(
            text=[prompt], images=[img.image for img in images], return_tensors="np"
        )
        ids = [int(t) for t in processed["input_ids"][0]]
        features = self.adapter.split_features(processed, len(images))
        return ids, self._items(ids, images, features)

    def _items(
        self, ids: list[int], images: Sequence[LoadedImage], features: list[dict[str, Any]]
    ) -> list[MultimodalItem]:
        positions = np.nonzero(np.asarray(ids) == self.adapter.image_token_id)[0]
        counts = [self.adapter.num_tokens(f) for f in features]
        if any(c is None for c in counts):
            if len(positions) % len(images):
                raise ValueError("cannot attribute image placeholder tokens to images")
            counts = [len(positions) // len(images)] * len(images)
        if sum(counts) != len(positions):
            raise ValueError(
                f"prompt has {len(positions)} image tokens but its {len(images)} image(s) need "
                f"{sum(counts)}: use one image placeholder per image"
            )
        bounds = np.cumsum([0, *counts])
        return [
            MultimodalItem(img.hash, spans_of(positions[bounds[i] : bounds[i + 1]]), feat)
            for i, (img, feat) in enumerate(zip(images, features))
        ]
