"""Prompt + images -> expanded input ids and one ``MultimodalItem`` per image.

Placeholder text is HF's own (``replace_image_token``), fed with the image's *layout*: the
processor outputs it reads, known from the image size alone (the family's size rule, or an
earlier image of the same size). Pixel preprocessing is then deferred to ``ImagePreprocessor``,
which runs only for images whose embedding is not cached; only an image whose layout nothing
can tell is preprocessed eagerly (its features ride with the item).
"""

from __future__ import annotations

import functools
import io
import json
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

from sglang.srt.core.mm_item import MultimodalItem, spans_of
from sglang.srt.models.adapters import ModelAdapter, get_adapter
from sglang.srt.models.adapters.base import Layout, context_key, layout_of, same_layout
from sglang.srt.multimodal import fast_preprocess
from sglang.srt.multimodal.hf_processor import load_hf_processor
from sglang.srt.multimodal.image_io import (
    DecodedImageCache,
    LoadedImage,
    content_hash,
    load_image,
)
from sglang.srt.multimodal.video_io import DecodedVideoCache, LoadedVideo, load_video
from sglang.srt.multimodal.video_preprocess import VideoSettings, preprocess_frames

LAYOUT_MEMO_SIZE = 4096


class ImagePreprocessor:
    """Runs the model's HF processor (``_process_images`` with the processor's merged image
    defaults, not the bare image processor: several processors switch on tiling options the
    image processor lacks) on one image at a time."""

    def __init__(
        self, hf_processor: Any, adapter: ModelAdapter, video_settings: VideoSettings | None = None
    ) -> None:
        self.video_settings = video_settings or VideoSettings()
        has_images = hasattr(hf_processor, "image_processor")
        self.processor = hf_processor if has_images else None
        self.image_processor = hf_processor.image_processor if has_images else None
        self.adapter = adapter
        self.images_kwargs = images_kwargs_of(hf_processor) if has_images else {}
        settings = b""
        if self.image_processor is not None:
            kwargs = json.dumps(self.images_kwargs, sort_keys=True, default=str)
            settings = self.image_processor.to_json_string().encode() + kwargs.encode()
        self.settings_hash = content_hash(settings).to_bytes(8, "little")
        self.num_preprocessed = 0
        self.fast_path_ok = self.image_processor is not None and all(
            _same(self.images_kwargs.get(key), getattr(self.image_processor, key, None))
            for key in self.images_kwargs
            if key not in ("return_tensors",)
        )

    def item_hash(self, image_hash: int, context: Layout) -> int:
        image = image_hash.to_bytes(8, "little")
        return content_hash(image, self.settings_hash, context_key(context))

    def process(
        self, image: Image.Image, context: Layout | None = None
    ) -> tuple[dict[str, Any], str]:
        """(features of one image in its prompt ``context`` as host arrays, the text replacing
        its placeholder)."""
        assert self.processor is not None, "this model does not accept images"
        out = self.adapter.preprocess(self.processor, image, context or {}, self.images_kwargs)
        self.num_preprocessed += 1
        return out

    def features(self, images: Sequence[Image.Image]) -> list[dict[str, Any]]:
        """The features of each image (host arrays); Qwen-VL images take the bit-identical
        fast path when the processor's merged options are the image processor's own."""
        if self.fast_path_ok and fast_preprocess.supports(self.image_processor, images):
            self.num_preprocessed += len(images)
            return [fast_preprocess.preprocess(self.image_processor, [image]) for image in images]
        return [self.process(image)[0] for image in images]

    def __call__(self, items: Sequence[MultimodalItem]) -> None:
        """Preprocess the items that lack features (cache misses)."""
        for item in items:
            if item.features is None and item.modality == "video":
                item.features = self._video_features(item)
        items = [item for item in items if item.modality != "video"]
        plain = [item for item in items if item.features is None and not item.context]
        in_context = [item for item in items if item.features is None and item.context]
        done = self.features([_pil(item.source) for item in plain])
        done += [self.process(_pil(item.source), item.context)[0] for item in in_context]
        for item, features in zip(plain + in_context, done):
            if not same_layout(item.layout, layout_of(features)):
                raise ValueError(
                    f"image layout {layout_of(features)} differs from the expected {item.layout}"
                )
            item.features = features

    def _video_features(self, item: MultimodalItem) -> dict[str, Any]:
        features = preprocess_frames(item.source, self.video_settings)
        expected = {k: v for k, v in item.layout.items() if k == "video_grid_thw"}
        if not same_layout(expected, layout_of(features)):
            raise ValueError(
                f"video layout {layout_of(features)} differs from the expected {item.layout}"
            )
        self.num_preprocessed += 1
        return features


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
        self.adapter = get_adapter(None, hf_config)
        self.is_multimodal = hasattr(hf_config, "vision_config")
        self.allowed_local_dir = allowed_local_dir
        self.seen = DecodedImageCache()
        self.video_settings = VideoSettings.from_model_dir(model_path)
        self.seen_videos = DecodedVideoCache()
        self.preprocessor = ImagePreprocessor(self.hf_processor, self.adapter, self.video_settings)
        # ((width, height), context key) -> layout learnt from preprocessing an image of that
        # size in that context: the layout depends on nothing else, so later such images are
        # expanded without pixels.
        self.layouts_by_size: OrderedDict[tuple[tuple[int, int], bytes], Layout] = OrderedDict()
        self._image_token_counts: dict[str, int] = {}

    def load_images(self, image_data: Sequence[Any]) -> list[LoadedImage]:
        return [load_image(src, self.allowed_local_dir, self.seen) for src in image_data]

    def load_videos(
        self, video_data: Sequence[Any], options: Sequence[dict[str, Any]] = ()
    ) -> list[LoadedVideo]:
        """``options``: each video's sampling options (``VideoSettings.with_options``)."""
        options = list(options) or [{}] * len(video_data)
        local = self.allowed_local_dir
        return [
            load_video(src, self.video_settings.with_options(opts), local, seen=self.seen_videos)
            for src, opts in zip(video_data, options)
        ]

    def process(
        self,
        prompt: str | None,
        input_ids: list[int] | None,
        images: Sequence[LoadedImage],
        add_special_tokens: bool = True,
        videos: Sequence[LoadedVideo] = (),
    ) -> tuple[list[int], list[MultimodalItem]]:
        """``add_special_tokens=False`` for text that already carries them (a rendered chat
        template that starts with BOS would otherwise get a second one). Items come in prompt
        order. Prompt text is laid out as the model's processor lays it out
        (``ModelAdapter.format_prompt``); given input ids are taken as they are."""
        if prompt is not None:
            prompt = self.adapter.format_prompt(self.hf_processor, prompt)
        if not images and not videos:
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
        # A processor whose prompts mark images with another token than the one it expands them
        # into (Qianfan-OCR: <image> -> <img><IMG_CONTEXT>...</img>) names it so.
        placeholder = getattr(proc, "image_placeholder_token", None) or proc.image_token
        found = prompt.count(placeholder) if images else 0
        if found != len(images):
            raise ValueError(
                f"the prompt has {found} image placeholder(s) ({placeholder!r}) but "
                f"{len(images)} image(s) were given"
            )
        items, replacements = [], []
        context = self.adapter.item_context(len(images))
        for img in images:
            item, replacement = self._item(img, context)
            items.append(item)
            replacements.append(replacement)
        if not videos:
            expanded = self._expanded_ids(prompt, placeholder, replacements, add_special_tokens)
            if expanded is not None:
                ids, counts = expanded
                self._assign_spans(ids, items, [(n, self.adapter.image_token_id) for n in counts])
                return ids, items
        videos_items, video_texts = self._video_items(prompt, videos)
        (text,), offsets = proc.get_text_with_replacements([prompt], replacements, video_texts)
        encoded = self.tokenizer(text, add_special_tokens=add_special_tokens)
        ids = [int(t) for t in encoded["input_ids"]]
        placed = sorted(offsets[0] if offsets else [], key=lambda o: o["new_span"][0])
        order = [o["type"] for o in placed]
        if len(order) != len(items) + len(videos_items):
            raise ValueError("the processor did not place every image and video placeholder")
        counts = {
            "image": [(self._image_tokens(r), self.adapter.image_token_id) for r in replacements],
            "video": [
                (self.adapter.video_rows(item.layout, self.video_settings), self._video_id)
                for item in videos_items
            ],
        }
        by_modality = {"image": iter(items), "video": iter(videos_items)}
        in_order = [next(by_modality[kind]) for kind in order if kind in by_modality]
        sizes = [counts[item.modality].pop(0) for item in in_order]
        self._assign_spans(ids, in_order, sizes)
        return ids, in_order

    def _expanded_ids(
        self, prompt: str, placeholder: str, replacements: list[str], add_special_tokens: bool
    ) -> tuple[list[int], list[int]] | None:
        """The prompt's ids and each image's token count, from the unexpanded prompt: each
        placeholder token repeated as many times as its replacement repeats it. The same ids as
        tokenizing the expanded text (the fast tokenizer takes ~20 ms over the 10k image tokens
        of an eight-image chat) wherever every replacement is the placeholder repeated and the
        placeholder is one added token: those are split out before anything else is tokenized,
        so their neighbours do not depend on how many copies stand there. None elsewhere."""
        token_id = self.adapter.image_token_id
        if placeholder not in self._added_tokens or self._added_tokens[placeholder] != token_id:
            return None
        counts = []
        for text in replacements:
            n, rest = divmod(len(text), len(placeholder))
            if rest or text != placeholder * n:
                return None
            counts.append(n)
        ids = self.tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"]
        at = [i for i, t in enumerate(ids) if t == token_id]
        if len(at) != len(counts):
            return None
        out: list[int] = []
        start = 0
        for i, n in zip(at, counts):
            out += ids[start:i]
            out += [token_id] * n
            start = i + 1
        out += ids[start:]
        return [int(t) for t in out], counts

    @functools.cached_property
    def _added_tokens(self) -> dict[str, int]:
        return getattr(self.tokenizer, "get_added_vocab", dict)()

    def _video_items(
        self, prompt: str, videos: Sequence[LoadedVideo]
    ) -> tuple[list[MultimodalItem], list[str]]:
        """One item per video (layout from its frames' count and size) and its placeholder
        text."""
        if not videos:
            return [], []
        token = getattr(self.hf_processor, "video_token", None)
        if token is None or self._video_id is None:
            raise ValueError("this model does not accept videos")
        found = prompt.count(token)
        if found != len(videos):
            raise ValueError(
                f"the prompt has {found} video placeholder(s) ({token!r}) but "
                f"{len(videos)} video(s) were given"
            )
        settings = self.video_settings
        items, texts = [], []
        for video in videos:
            layout = self.adapter.video_layout(video, settings)
            sampled = video.settings or settings  # a request's options change the frames
            key = content_hash(video.hash.to_bytes(8, "little"), sampled.digest())
            rows = self.adapter.video_group_rows(layout, settings)
            items.append(
                MultimodalItem(key, [], layout, video.frames, modality="video", group_rows=rows)
            )
            texts.append(self.adapter.video_replacement(self.hf_processor, layout, settings))
        return items, texts

    def image_item(self, img: LoadedImage) -> MultimodalItem:
        """The item of ``img`` alone in a prompt, holding its embedding rows from 0."""
        item, replacement = self._item(img, {})
        item.spans = [(0, self._image_tokens(replacement))]
        return item

    def _item(self, img: LoadedImage, context: Layout) -> tuple[MultimodalItem, str]:
        """The item of one image in its prompt ``context`` and its placeholder text;
        preprocesses eagerly only when neither the family's size rule nor an earlier image of
        the same size and context gives the layout."""
        item_hash = self.preprocessor.item_hash(img.hash, context)
        item = MultimodalItem(item_hash, [], source=img.source, context=context)
        kwargs = self.preprocessor.images_kwargs
        layout = self.adapter.layout_from_size(self.hf_processor, kwargs, *img.size)
        if layout is not None:
            layout = {**layout, **context}
        memo_key = (img.size, context_key(context))
        if layout is None:
            layout = self.layouts_by_size.get(memo_key)
        if layout is None:
            item.features, replacement = self.preprocessor.process(img.pil(), context)
            item.layout = layout_of(item.features)
            self._remember(memo_key, item.layout)
            return item, replacement
        item.layout = layout
        return item, self.adapter.replacement(self.hf_processor, layout, kwargs)

    def _remember(self, key: tuple[tuple[int, int], bytes], layout: Layout) -> None:
        self.layouts_by_size[key] = layout
        if len(self.layouts_by_size) > LAYOUT_MEMO_SIZE:
            self.layouts_by_size.popitem(last=False)

    def _image_tokens(self, replacement: str) -> int:
        """Embedding rows of an image: the image tokens in its replacement (wrapper, break and
        tile tokens around them keep their text embeddings)."""
        count = self._image_token_counts.get(replacement)
        if count is None:
            ids = self.tokenizer(replacement, add_special_tokens=False)["input_ids"]
            count = sum(1 for t in ids if t == self.adapter.image_token_id)
            if len(self._image_token_counts) >= LAYOUT_MEMO_SIZE:
                self._image_token_counts.clear()
            self._image_token_counts[replacement] = count
        return count

    @property
    def _video_id(self) -> int | None:
        return self.adapter.video_placeholder_id

    def _assign_spans(
        self, ids: list[int], items: list[MultimodalItem], sizes: list[tuple[int, int]]
    ) -> None:
        """Items in prompt order, each with (rows, placeholder token): each owns the next
        ``rows`` positions of its token, one span for a contiguous run, several when break,
        tile or frame tokens interleave (images and videos may share a token: GLM, InternVL)."""
        array = np.asarray(ids)
        positions = {token: np.nonzero(array == token)[0] for _, token in sizes}
        used = dict.fromkeys(positions, 0)
        for item, (rows, token) in zip(items, sizes):
            item.spans = spans_of(positions[token][used[token] : used[token] + rows])
            used[token] += rows
        for token, found in positions.items():
            if used[token] != len(found):
                kinds = sorted({item.modality for item, (_, t) in zip(items, sizes) if t == token})
                raise ValueError(
                    f"prompt has {len(found)} {' / '.join(kinds)} tokens but its {len(items)} "
                    f"item(s) need {used[token]}: use one placeholder per image or video"
                )


def images_kwargs_of(hf_processor: Any) -> dict[str, Any]:
    """The processor's merged image defaults (what its ``__call__`` would pass), with numpy
    outputs."""
    tokenizer = getattr(hf_processor, "tokenizer", None)
    init = tokenizer.init_kwargs if tokenizer is not None else {}
    merged = hf_processor._merge_kwargs(tokenizer_init_kwargs=init, return_tensors="np")
    return merged["images_kwargs"]


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(np.all(a == b)) if a is not None else True
    except (TypeError, ValueError):
        return False


def _pil(source: Any) -> Image.Image:
    if isinstance(source, Image.Image):
        return source
    return Image.open(io.BytesIO(source)).convert("RGB")
