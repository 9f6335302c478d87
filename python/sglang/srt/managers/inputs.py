"""Normalising SGLang-style generate inputs (single or batched) into tokenized requests; shared
by the offline engine and the HTTP server."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sglang.srt.core.io_struct import TokenizedRequest
from sglang.srt.multimodal.image_io import LoadedImage
from sglang.srt.multimodal.processor import MultimodalProcessor
from sglang.srt.multimodal.video_io import LoadedVideo
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs


@dataclass
class GenerateInput:
    """One request of a (possibly batched) generate call, before tokenization."""

    rid: str
    prompt: str | None
    input_ids: list[int] | None
    images: list[Any]
    sampling_params: SamplingParams
    add_special_tokens: bool = True
    videos: list[Any] = field(default_factory=list)
    video_options: list[dict[str, Any]] = field(default_factory=list)  # one per video


def split_generate_inputs(
    prompt: str | list[str] | None,
    sampling_params: dict | list[dict] | None,
    input_ids: list[int] | list[list[int]] | None,
    image_data: Any,
    rid: str | list[str] | None = None,
    video_data: Any = None,
    mm_processor_kwargs: dict[str, Any] | None = None,
) -> tuple[list[GenerateInput], bool]:
    """Validate the shapes of a generate call; returns (one input per request, batched?).
    ``mm_processor_kwargs``: sampling options for every video of the call."""
    if mm_processor_kwargs is not None and not isinstance(mm_processor_kwargs, dict):
        raise ValueError("mm_processor_kwargs must be an object")
    if (prompt is None) == (input_ids is None):
        raise ValueError("give exactly one of text/prompt and input_ids")
    batched = isinstance(prompt, list) or bool(input_ids and isinstance(input_ids[0], list))
    if prompt is not None:
        prompts = prompt if batched else [prompt]
        if not all(isinstance(p, str) for p in prompts):
            raise ValueError("prompts must be strings")
        n = len(prompts)
    else:
        ids_list = input_ids if batched else [input_ids]
        if not all(isinstance(t, int) for ids in ids_list for t in ids):  # type: ignore[union-attr]
            raise ValueError("input_ids must be integers")
        n = len(ids_list)  # type: ignore[arg-type]
    if n == 0:
        raise ValueError("the batch is empty")
    images = _per_request(_image_lists(image_data, n, batched), n, batched, "image_data")
    videos = _per_request(_image_lists(video_data, n, batched), n, batched, "video_data")
    params = _per_request(sampling_params, n, batched, "sampling_params", allow_dict=True)
    rids = _per_request(rid, n, batched, "rid")
    if not all(r is None or isinstance(r, str) for r in rids):
        raise ValueError("rid must be a string (a list of strings for a batch)")
    return [
        GenerateInput(
            rid=rids[i] or uuid.uuid4().hex,
            prompt=prompts[i] if prompt is not None else None,
            input_ids=ids_list[i] if input_ids is not None else None,  # type: ignore[index]
            images=_as_list(images[i]),
            sampling_params=SamplingParams.from_dict(params[i]),
            videos=_as_list(videos[i]),
            video_options=[dict(mm_processor_kwargs or {})] * len(_as_list(videos[i])),
        )
        for i in range(n)
    ], batched


def tokenize(
    processor: MultimodalProcessor,
    args: ServerArgs,
    inp: GenerateInput,
    images: list[LoadedImage],
    videos: Sequence[LoadedVideo] = (),
) -> TokenizedRequest:
    check_mm_limits(args, len(images), len(videos))
    if inp.input_ids is not None:
        _check_ids(inp.input_ids, processor)  # before they are decoded for image expansion
    ids, items = processor.process(
        inp.prompt, inp.input_ids, images, inp.add_special_tokens, videos=videos
    )
    tokenized = TokenizedRequest(inp.rid, ids, inp.sampling_params, items)
    tokenized.validate(*_vocab_and_image_token(processor), processor.adapter.video_placeholder_id)
    return tokenized


def check_mm_limits(args: ServerArgs, num_images: int, num_videos: int) -> None:
    """--limit-mm-data-per-request, per modality."""
    for name, count in (("image", num_images), ("video", num_videos)):
        limit = args.mm_limit(name)
        if limit is not None and count > limit:
            raise ValueError(f"{count} {name}s in one request; the limit is {limit}")


def _vocab_and_image_token(processor: MultimodalProcessor) -> tuple[int, int | None]:
    adapter = processor.adapter
    return adapter.text_config.vocab_size, adapter.image_token_id


def _check_ids(input_ids: list[int], processor: MultimodalProcessor) -> None:
    vocab, _ = _vocab_and_image_token(processor)
    TokenizedRequest("", input_ids, None, []).validate(vocab, None)  # type: ignore[arg-type]


def _per_request(value: Any, n: int, batched: bool, name: str, allow_dict: bool = False) -> list:
    if not batched:
        return [value]
    if value is None or (allow_dict and isinstance(value, dict)):
        return [value] * n
    if not isinstance(value, list) or len(value) != n:
        raise ValueError(f"{name} must be a list with one entry per prompt ({n})")
    return value


def _image_lists(image_data: Any, n: int, batched: bool) -> Any:
    """SGLang's rules for a batch: one image outside a list goes with every prompt, and an
    empty list means no images."""
    if not batched:
        return image_data
    if image_data is not None and not isinstance(image_data, list):
        return [image_data] * n
    return image_data or None


def _as_list(images: Any) -> list:
    if images is None:
        return []
    return list(images) if isinstance(images, (list, tuple)) else [images]
