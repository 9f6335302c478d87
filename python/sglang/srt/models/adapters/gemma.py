"""Gemma families: Gemma 3 and ShieldGemma 2 (fixed soft tokens, images attend both ways),
Gemma 4 (aspect-preserving resize under a soft-token budget) and PaliGemma (a prefix-LM).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sglang.srt.models.adapters.base import Layout, ModelAdapter
from sglang.srt.models.adapters.tiled import FixedCountAdapter


class Gemma3Adapter(ModelAdapter):
    """Gemma3: image tokens attend bidirectionally, so a chunk never splits an image; without
    pan-and-scan every image is one fixed-size crop."""

    bidirectional = "images"

    def layout_from_size(
        self, processor: Any, images_kwargs: dict[str, Any], width: int, height: int
    ) -> Layout | None:
        if images_kwargs.get("do_pan_and_scan"):
            return None
        return {"num_crops": np.array([0])}


class Gemma4Adapter(ModelAdapter):
    """Gemma 4: an image is resized, keeping its aspect, to the most patches the soft-token
    budget allows, so its token count is a size rule. Where the checkpoint says
    ``use_bidirectional_attention="vision"``, an image's tokens attend both ways in the
    sliding-window layers only (HF's ``create_masks_for_vision_model``). Per-layer KV shapes and
    shared KV come from ``KVLayout``; per-layer inputs from ``token_lm_kwargs``."""

    bidirectional_sliding_only = True
    pad_media_tokens = True

    def __init__(self, model: Any, config: Any) -> None:
        super().__init__(model, config)
        mode = getattr(self.text_config, "use_bidirectional_attention", None)
        if mode not in (None, "vision"):
            raise ValueError(f"Gemma 4 with use_bidirectional_attention={mode!r} is an encoder")
        self.bidirectional = "images" if mode == "vision" else None

    def layout_from_size(
        self, processor: Any, images_kwargs: dict[str, Any], width: int, height: int
    ) -> Layout | None:
        from transformers.models.gemma4.image_processing_pil_gemma4 import (
            get_aspect_ratio_preserving_size,
        )

        image_processor = processor.image_processor
        setting = {
            key: images_kwargs.get(key) or getattr(image_processor, key)
            for key in ("patch_size", "max_soft_tokens", "pooling_kernel_size")
        }
        if not images_kwargs.get("do_resize", image_processor.do_resize):
            return None
        pool = setting["pooling_kernel_size"]
        patch = setting["patch_size"]
        resized = get_aspect_ratio_preserving_size(
            height, width, patch, setting["max_soft_tokens"] * pool**2, pool
        )
        tokens = (resized[0] // patch) * (resized[1] // patch) // pool**2
        return {"num_soft_tokens_per_image": np.array([tokens])}


class PaliGemmaAdapter(FixedCountAdapter):
    """PaliGemma / PaliGemma 2: a prefix-LM. The processor lays a prompt out as its images,
    ``<bos>``, the text and a newline; that whole prefix attends both ways (HF's
    ``token_type_ids`` 0), the answer causally, so the prompt is prefilled in one piece and its
    KV serves only the same prompt again. Positions count from 1. Every image is resized to one
    square: a fixed ``image_seq_length`` tokens."""

    bidirectional = "prompt"
    window_bounds_spans = False
    position_offset = 1

    def format_prompt(self, processor: Any, prompt: str) -> str:
        bos = processor.tokenizer.bos_token
        image = processor.image_token
        cut = prompt.rfind(image) + len(image) if image in prompt else 0
        return prompt[:cut] + bos + prompt[cut:] + "\n"


class ShieldGemma2Adapter(Gemma3Adapter):
    """ShieldGemma 2: Gemma 3 under its own model_type, its checkpoints stored for
    ``ShieldGemma2ForImageClassification`` (the Gemma 3 model under ``model.``, the pre-5.0 key
    names), whose key renaming transformers 5 applies to every class loading a
    ``shieldgemma2`` config: AutoModelForImageTextToText would miss the language model's
    weights. The classifier is loaded and its Gemma 3 model served, for generation (its
    Yes / No probabilities are the logits of those two tokens)."""

    checkpoint_class = "ShieldGemma2ForImageClassification"
