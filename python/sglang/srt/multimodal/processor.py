"""Prompt + images -> expanded input ids and one ``MultimodalItem`` per image.

Placeholder expansion uses only each image's size (HF's own replacement strings, fed with a
layout computed from the size); pixel preprocessing is deferred to ``ImagePreprocessor``, which
runs only for images whose embedding is not cached.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

from sglang.srt.models.adapters import ModelAdapter, get_adapter
from sglang.srt.multimodal import fast_preprocess
from sglang.srt.multimodal.hf_processor import load_hf_processor
from sglang.srt.multimodal.image_io import (
    DecodedImageCache,
    LoadedImage,
    content_hash,
    load_image,
)
from sglang.srt.multimodal.items import MultimodalItem, spans_of


class ImagePreprocessor:
    """Runs the HF image processor on items that lack features (cache misses)."""

    def __init__(self, image_processor: Any, adapter: ModelAdapter) -> None:
        self.image_processor = image_processor
        self.adapter = adapter
        settings = image_processor.to_json_string().encode() if image_processor else b""
        self.settings_hash = content_hash(settings).to_bytes(8, "little")
        self.num_preprocessed = 0

    def item_hash(self, image_hash: int) -> int:
        return content_hash(image_hash.to_bytes(8, "little"), self.settings_hash)

    def features(self, images: Sequence[Image.Image]) -> list[dict[str, Any]]:
        if fast_preprocess.supports(self.image_processor, images):
            processed = fast_preprocess.preprocess(self.image_processor, images)
        else:
            processed = self.image_processor(images=list(images), return_tensors="np")
        self.num_preprocessed += len(images)
        return self.adapter.split_features(processed, len(images))

    def __call__(self, items: Sequence[MultimodalItem]) -> None:
        todo = [item for item in items if item.features is None]
        if not todo:
            return
        for item, features in zip(todo, self.features([_pil(item.source) for item in todo])):
            layout = self.adapter.layout_of(features)
            if not _same_layout(layout, item.layout):
                raise ValueError(f"image layout {layout} differs from the expected {item.layout}")
            item.features = features


class MultimodalProcessor:
    def __init__(
        self,
        model_path: str,
        hf_config: Any,
        allowed_local_dir: str | None = "*",
        hf_processor: Any = None,
    ):
        self.hf_processor = hf_processor or load_hf_processor(model_path)
        self.tokenizer = getattr(self.hf_processor, "tokenizer", self.hf_processor)
        self.adapter = get_adapter(None, hf_config)  # type: ignore[arg-type]
        self.is_multimodal = hasattr(hf_config, "vision_config")
        self.allowed_local_dir = allowed_local_dir
        self.seen = DecodedImageCache()
        self.preprocessor = ImagePreprocessor(
            getattr(self.hf_processor, "image_processor", None), self.adapter
        )

    def load_images(self, image_data: Sequence[Any]) -> list[LoadedImage]:
        return [load_image(src, self.allowed_local_dir, self.seen) for src in image_data]

    def process(
        self,
        prompt: str | None,
        input_ids: list[int] | None,
        images: Sequence[LoadedImage],
        add_special_tokens: bool = True,
    ) -> tuple[list[int], list[MultimodalItem]]:
        """``add_special_tokens=False`` for text that already carries them (a rendered chat
        template that starts with BOS would otherwise get a second one)."""
        if not images:
            if input_ids is None:
                input_ids = self.tokenizer(prompt, add_special_tokens=add_special_tokens)[
                    "input_ids"
                ]
            return list(input_ids), []
        if not self.is_multimodal:
            raise ValueError("this model does not accept images")
        if prompt is None:
            assert input_ids is not None
            prompt = self.tokenizer.decode(input_ids)
        proc = self.hf_processor
        found = prompt.count(proc.image_token)
        if found != len(images):
            raise ValueError(
                f"the prompt has {found} image placeholder(s) ({proc.image_token!r}) but "
                f"{len(images)} image(s) were given"
            )
        items = [self._item(img) for img in images]
        replacements = [self.adapter.replacement(proc, item.layout) for item in items]
        (text,), _ = proc.get_text_with_replacements([prompt], replacements)
        encoded = self.tokenizer(text, add_special_tokens=add_special_tokens)
        ids = [int(t) for t in encoded["input_ids"]]
        self._assign_spans(ids, items)
        return ids, items

    def _item(self, img: LoadedImage) -> MultimodalItem:
        item = MultimodalItem(self.preprocessor.item_hash(img.hash), [], source=img.source)
        layout = self.adapter.layout(self.preprocessor.image_processor, *img.size)
        if layout is None:
            item.features = self.preprocessor.features([img.pil()])[0]
            layout = self.adapter.layout_of(item.features)
        item.layout = layout
        return item

    def _assign_spans(self, ids: list[int], items: list[MultimodalItem]) -> None:
        positions = np.nonzero(np.asarray(ids) == self.adapter.image_token_id)[0]
        counts = [self.adapter.num_tokens(item.layout) for item in items]
        if any(c is None for c in counts):
            if len(positions) % len(items):
                raise ValueError("cannot attribute image placeholder tokens to images")
            counts = [len(positions) // len(items)] * len(items)
        if sum(counts) != len(positions):  # type: ignore[arg-type]
            raise ValueError(
                f"prompt has {len(positions)} image tokens but its {len(items)} image(s) need "
                f"{sum(counts)}: use one image placeholder per image"  # type: ignore[arg-type]
            )
        bounds = np.cumsum([0, *counts])
        for i, item in enumerate(items):
            item.spans = spans_of(positions[bounds[i] : bounds[i + 1]])


def _pil(source: Any) -> Image.Image:
    if isinstance(source, Image.Image):
        return source
    return Image.open(io.BytesIO(source)).convert("RGB")


def _same_layout(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
