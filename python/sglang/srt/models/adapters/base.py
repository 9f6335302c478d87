"""The generic VLM adapter, driven by transformers' own API.

An adapter never reimplements a forward pass. Everything it needs comes from the model's HF
processor and model classes:

- placeholder text: ``processor.replace_image_token`` fed with one image's *layout* (the
  processor outputs the replacement reads, with pixel arrays reduced to their shapes);
- embedding rows of an image: the count of ``image_token_id`` in its replacement (HF merges
  with ``masked_scatter``, one row per image token; break and wrapper tokens stay text);
- the encoder: ``get_image_features`` with the keyword arguments its signature accepts, the
  output split per image (a list/tuple per image, or a tensor cut into each image's rows);
- the language model: ``language_model`` or ``text_model`` of the inner model;
- positions: M-RoPE through ``get_rope_index`` wherever the model has it.

Family subclasses (modules ``grid``, ``llava``, ``gemma``, ``tiled``) override only what really
differs and say why.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from sglang.srt.mem_cache.mm_embedding_cache import CachedEmbedding

Layout = dict[str, Any]
_MEDIA = ("image", "video", "audio")


class PixelShape(tuple):
    """A pixel array reduced to its shape inside a layout (replacements read only shapes)."""


class ModelAdapter:
    #: prompt tokens that attend to each other in both directions, never split by a chunk:
    #: None (none), "images" (each image's tokens: Gemma 3, Gemma 4) or "prompt" (the whole
    #: prompt: a prefix-LM such as PaliGemma, whose KV is then reusable only by the same prompt)
    bidirectional: str | None = None
    #: the bidirectional spans hold only in the sliding-window layers (Gemma 4)
    bidirectional_sliding_only = False
    #: the transformers class the family's checkpoints are stored for, where
    #: AutoModelForImageTextToText cannot load them (ShieldGemma 2's classifier); the served
    #: model is its ``model``
    checkpoint_class: str | None = None
    #: in a sliding-window layer, a span's tokens see each other only within the window (Gemma 3
    #: and 4: window AND (causal OR span)); False: whatever the window (PaliGemma 2: (causal AND
    #: window) OR span)
    window_bounds_spans = True
    #: added to every rotary position (PaliGemma counts from 1)
    position_offset = 0
    #: media placeholder tokens embed as padding, as HF's forward pads them (Gemma 4)
    pad_media_tokens = False
    #: the vision tower encodes a video's frame groups independently of each other, so a video
    #: may be encoded (and cached) group by group with the same result
    separable_video_groups = False

    def __init__(self, model: nn.Module | None, config: Any) -> None:
        self.model = model
        self.config = config
        self.text_config = config.get_text_config()
        token_id = getattr(config, "image_token_id", None)
        self.image_token_id: int | None = (
            token_id if token_id is not None else getattr(config, "image_token_index", None)
        )
        self.video_token_id: int | None = getattr(config, "video_token_id", None)

    # Language model -------------------------------------------------------------------------
    @property
    def inner(self) -> nn.Module:
        """The model under the LM head (``model.model`` for HF's *ForConditionalGeneration)."""
        assert self.model is not None
        return getattr(self.model, "model", self.model)

    @property
    def language_model(self) -> nn.Module:
        inner = self.inner
        for name in ("language_model", "text_model"):
            lm = getattr(inner, name, None)
            if lm is not None:
                return lm
        return inner

    @property
    def uses_mrope(self) -> bool:
        return self.model is not None and hasattr(self.inner, "get_rope_index")

    def lm_kwargs(self, image_positions: torch.Tensor, extras: list[torch.Tensor]) -> dict:
        """Extra language-model inputs for the image tokens of a step. Extras are Qwen3-VL-style
        deepstack features, added at early decoder layers at the image positions."""
        if not extras:
            return {}
        return {"visual_pos_masks": image_positions, "deepstack_visual_embeds": extras}

    def text_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The ids whose text embeddings a step starts from (T,): out-of-vocabulary ids as 0
        and, where HF's forward does so (``pad_media_tokens``: Gemma 4), image / video / audio
        placeholders as padding, generated ones included (image rows are then written over
        them by the embedder)."""
        in_vocab = input_ids < self.text_config.vocab_size
        ids = torch.where(in_vocab, input_ids, torch.zeros_like(input_ids))
        if not self.pad_media_tokens:
            return ids
        pad = self.text_config.pad_token_id
        for kind in _MEDIA:
            token = getattr(self.config, f"{kind}_token_id", None)
            if token is not None:
                ids = torch.where(input_ids == token, pad, ids)
        return ids

    def token_lm_kwargs(self, input_ids: torch.Tensor) -> dict[str, Any]:
        """Language-model inputs computed from a step's token ids (T,) rather than from their
        embeddings: Gemma 4's per-layer inputs, from the same ``text_ids`` as the embeddings.
        Empty for most models."""
        if not getattr(self.text_config, "hidden_size_per_layer_input", None):
            return {}
        text_ids = self.text_ids(input_ids)[None]
        return {"per_layer_inputs": self.language_model.get_per_layer_inputs(text_ids)}

    def format_prompt(self, processor: Any, prompt: str) -> str:
        """The prompt text as the model's processor lays it out before expanding placeholders
        (PaliGemma adds ``<bos>`` after the images and a newline); unchanged for most models."""
        return prompt

    def token_embedding_overrides(self) -> dict[int, torch.Tensor]:
        """Token id -> embedding that replaces the text embedding of that token in the prompt of
        a request with images (Ovis2's indicator tokens); empty for most models."""
        return {}

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The LM head's own scaling, which its causal-LM class applies and HF's VLM wrappers
        around it skip: Granite divides by ``logits_scaling``, Cohere multiplies by
        ``logit_scale``."""
        scaling = getattr(self.text_config, "logits_scaling", None)
        if scaling and scaling != 1:
            logits = logits / scaling
        scale = getattr(self.text_config, "logit_scale", None)
        if scale and scale != 1:
            logits = logits * scale
        return logits

    # Image layout and placeholder text (processor side; ``model`` may be None here) ----------
    def layout_from_size(
        self, processor: Any, images_kwargs: dict[str, Any], width: int, height: int
    ) -> Layout | None:
        """The layout of a ``width`` x ``height`` image by the family's resize rule, or None
        when there is no such rule here (then the size memo or preprocessing tells)."""
        return None

    def replacement(self, processor: Any, layout: Layout, images_kwargs: dict[str, Any]) -> str:
        """The text that replaces one image placeholder: HF's own expansion."""
        return processor.replace_image_token(layout_inputs(layout), 0, **images_kwargs)

    def item_context(self, num_items: int) -> Layout:
        """The processor outputs that an image's features, embedding and placeholders take
        from the rest of its prompt, which has ``num_items`` images; empty where an image is
        its own (transformers' convention). They are part of the image's cache key and
        layout, so one image gets one entry per context."""
        return {}

    def preprocess(
        self, processor: Any, image: Any, context: Layout, images_kwargs: dict[str, Any]
    ) -> tuple[dict[str, Any], str]:
        """(features of one image in ``context``, the text replacing its placeholder)."""
        processed, replacements = processor._process_images([image], **images_kwargs)
        return dict(processed), replacements[0]

    # Vision encoder -------------------------------------------------------------------------
    @property
    def image_features_fn(self) -> Callable[..., Any]:
        inner = self.inner
        return getattr(inner, "get_image_features", None) or self.model.get_image_features

    def encode(self, features: list[dict[str, Any]], rows: Sequence[int]) -> list[CachedEmbedding]:
        """Encode device-side feature dicts of several images in one call; ``rows[i]`` is the
        number of embedding rows image i needs."""
        return encode_split(self.image_features_fn, features, rows)

    # Video (processor side for the layout and text; encoder side for ``encode_videos``) -----
    @property
    def video_placeholder_id(self) -> int | None:
        """The token whose positions in an expanded prompt are video embedding rows (GLM-4.1V
        and InternVL write a video's frames with the image token)."""
        return self.video_token_id

    def mm_token_types(self, ids: np.ndarray) -> np.ndarray:
        """HF's ``mm_token_type_ids`` of a prompt: 1 image rows, 2 video rows, 0 text."""
        types = (ids == self.image_token_id).astype(np.int64)
        if self.video_token_id is not None:
            types[ids == self.video_token_id] = 2
        return types

    def video_layout(self, video: Any, settings: Any) -> Layout:
        """The layout of a ``LoadedVideo`` (its resized frames) under video ``settings``."""
        raise ValueError("this model does not accept videos")

    def video_group_rows(self, layout: Layout, settings: Any) -> int:
        """Embedding rows of one frame group of a video with ``layout``."""
        raise ValueError("this model does not accept videos")

    def video_rows(self, layout: Layout, settings: Any) -> int:
        """Embedding rows of a whole video: its frame groups' (a family may add trailing rows
        that belong to no frame group, which its last group then owns)."""
        return self.video_group_rows(layout, settings) * video_num_groups(layout)

    def video_replacement(self, processor: Any, layout: Layout, settings: Any) -> str:
        """The text that replaces one video placeholder: HF's ``replace_video_token``, with a
        stand-in for the video processor it reads settings from (never built here)."""
        view = _WithVideoProcessor(processor, settings)
        return type(processor).replace_video_token(view, self.video_inputs(layout), 0)

    def video_inputs(self, layout: Layout) -> dict[str, Any]:
        """A layout as the video processor's outputs for one video."""
        return layout_inputs(layout)

    @property
    def video_features_fn(self) -> Callable[..., Any]:
        return getattr(self.inner, "get_video_features", None) or self.model.get_video_features

    def encode_videos(
        self, features: list[dict[str, Any]], rows: Sequence[int]
    ) -> list[CachedEmbedding]:
        """``encode`` for videos (or frame groups of videos)."""
        return encode_split(self.video_features_fn, features, rows)

    def mrope(self, input_ids: list[int], layouts: list[Layout]) -> tuple[torch.Tensor, int]:
        """(3, L) M-RoPE positions of a prompt and the decode position delta; ``layouts`` are
        the prompt's items in order (images and videos)."""
        fn = self.inner.get_rope_index
        ids = torch.tensor([input_ids])
        accepted = accepted_kwargs(fn)
        kwargs: dict[str, Any] = {}
        images = [layout for layout in layouts if "image_grid_thw" in layout]
        videos = [layout for layout in layouts if "video_grid_thw" in layout]
        if images and "image_grid_thw" in accepted:
            grids = [torch.as_tensor(layout["image_grid_thw"]) for layout in images]
            kwargs["image_grid_thw"] = torch.cat(grids)
        if videos and "video_grid_thw" in accepted:
            kwargs["video_grid_thw"] = torch.cat(
                [torch.as_tensor(layout["video_grid_thw"]) for layout in videos]
            )
            if "second_per_grid_ts" in accepted:
                seconds = [float(layout["second_per_grid_ts"]) for layout in videos]
                kwargs["second_per_grid_ts"] = torch.tensor(seconds)
        mm_types = torch.from_numpy(self.mm_token_types(np.asarray(input_ids)))[None]
        positions, delta = fn(ids, mm_token_type_ids=mm_types, **kwargs)
        return positions[:, 0], int(delta.reshape(-1)[0])


class TextAdapter(ModelAdapter):
    """Text-only models: no images, plain positions."""


# Helpers --------------------------------------------------------------------------------------
class _WithVideoProcessor:
    """A processor seen with a stand-in video processor holding the video ``settings``."""

    def __init__(self, processor: Any, settings: Any) -> None:
        self._processor = processor
        self.video_processor = settings

    def __getattr__(self, name: str) -> Any:
        return getattr(self._processor, name)


def video_num_groups(layout: Layout) -> int:
    """Frame groups of a video: its temporal grid (Qwen, GLM), else its frames."""
    if "video_grid_thw" in layout:
        return int(np.asarray(layout["video_grid_thw"]).reshape(-1)[0])
    return int(layout["pixel_values_videos"][1])


def layout_of(features: dict[str, Any]) -> Layout:
    """An image's layout from its preprocessed features: pixel arrays become their shapes."""
    return {
        k: PixelShape(np.shape(v)) if "pixel" in k else _as_numpy(v) for k, v in features.items()
    }


def layout_inputs(layout: Layout) -> dict[str, Any]:
    """A layout as processor outputs of one image (zero-stride arrays stand for pixels)."""
    return {
        k: np.broadcast_to(np.float32(0), v) if isinstance(v, PixelShape) else v
        for k, v in layout.items()
    }


def context_key(context: Layout) -> bytes:
    """Bytes that identify an item context (empty for none, so such keys do not change)."""
    if not context:
        return b""
    return repr(sorted((k, np.asarray(v).tolist()) for k, v in context.items())).encode()


def same_layout(expected: Layout, actual: Layout) -> bool:
    """Whether ``actual`` agrees with every entry ``expected`` has."""
    return all(k in actual and np.array_equal(v, actual[k]) for k, v in expected.items())


@functools.cache
def _accepted(fn: Any) -> frozenset[str]:
    params = inspect.signature(fn).parameters.values()
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(p.name for p in params if p.kind in named and p.name != "self")


def accepted_kwargs(fn: Callable[..., Any]) -> frozenset[str]:
    """Named parameters of ``fn`` (a bound method's underlying function is cached)."""
    return _accepted(getattr(fn, "__func__", fn))


def batch_features(features: list[dict[str, Any]], names: frozenset[str]) -> dict[str, Any]:
    """Stack the per-image features that ``names`` accepts along dim 0, zero-padding the other
    dims to the batch maximum (what HF processors do for a batch: the models drop the padding
    by ``image_sizes`` or by all-zero tiles)."""
    out: dict[str, Any] = {}
    for name in names:
        # Per-view arrays (DeepSeek-OCR2's local tiles) are absent for an image without such
        # views: the others' are concatenated, as the processor does for a batch.
        values = [f[name] for f in features if name in f]
        if not values:
            continue
        if all(isinstance(v, torch.Tensor) for v in values):
            out[name] = _pad_cat(values)
        else:
            out[name] = [x for v in values for x in (v if isinstance(v, (list, tuple)) else [v])]
    return out


def encode_split(
    fn: Callable[..., Any], features: list[dict[str, Any]], rows: Sequence[int]
) -> list[CachedEmbedding]:
    """Call a ``get_*_features`` function on the batched features of several items and split
    its output (and deepstack layers, where the model has them) into ``rows[i]`` rows each."""
    out = fn(**batch_features(features, accepted_kwargs(fn)))
    embeds = split_rows(_pooled(out), rows)
    deepstack = getattr(out, "deepstack_features", None) or []
    layers = [split_rows(layer, rows) for layer in deepstack]
    return [CachedEmbedding(embeds[i], [layer[i] for layer in layers]) for i in range(len(rows))]


def _pad_cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    if len(tensors) == 1:
        return tensors[0]
    shape = [max(t.shape[d] for t in tensors) for d in range(1, tensors[0].ndim)]
    padded = []
    for t in tensors:
        pad = [x for d in reversed(range(1, t.ndim)) for x in (0, shape[d - 1] - t.shape[d])]
        padded.append(torch.nn.functional.pad(t, pad) if any(pad) else t)
    return torch.cat(padded)


def _pooled(out: Any) -> Any:
    pooled = getattr(out, "pooler_output", None)
    if pooled is not None:
        return pooled
    if isinstance(out, (torch.Tensor, list, tuple)):
        return out
    return out.last_hidden_state


def split_rows(embeds: Any, rows: Sequence[int]) -> list[torch.Tensor]:
    """Per-image (rows_i, hidden) tensors from an encoder output: a list/tuple with one entry
    per image, or anything whose rows, in image order, are every image's rows."""
    if isinstance(embeds, (list, tuple)) and len(embeds) == len(rows):
        parts = [e.reshape(-1, e.shape[-1]) for e in embeds]
        if [p.shape[0] for p in parts] == list(rows):
            return parts
    if isinstance(embeds, (list, tuple)):
        embeds = torch.cat([e.reshape(-1, e.shape[-1]) for e in embeds])
    flat = embeds.reshape(-1, embeds.shape[-1])
    if flat.shape[0] != sum(rows):
        raise RuntimeError(
            f"vision encoder gave {flat.shape[0]} rows for images needing {list(rows)}"
        )
    return list(torch.split(flat, list(rows)))


def _as_numpy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.numpy()
    return np.asarray(value) if isinstance(value, (list, tuple)) else value
