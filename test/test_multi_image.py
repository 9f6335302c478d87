"""Every family with one, two and three images of different sizes per prompt matches HF (each
prompt's images given to the processor as one sample). One image comes alone and among others,
so a family whose image embedding depends on the prompt's other images (LLaVA-OneVision: a lone
image is tiled, an image among several keeps its base view) must not reuse one for the other:
batched, chunked through the images, and again from the cached prefix."""

from __future__ import annotations

import functools

import pytest
from conftest import ALL_VLM_FAMILIES, examples, hf_greedy, make_image, model_dir, placeholder
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoConfig

import sglang
from sglang.srt.core.mm_item import MultimodalItem
from sglang.srt.multimodal.processor import MultimodalProcessor

MAX_NEW = 6
GREEDY = {"temperature": 0, "max_new_tokens": MAX_NEW}
CHUNKS = (11, 7, 5, 3, 2)  # the largest that cuts an image of every prompt is taken


@functools.cache
def _engine(family: str) -> sglang.Engine:
    return sglang.Engine(
        dtype="float32", model_path=model_dir(family), chunked_prefill_size=_cutting_chunk(family)
    )


def _cutting_chunk(family: str) -> int:
    path = model_dir(family)
    processor = MultimodalProcessor(path, AutoConfig.from_pretrained(path))
    prompts = [
        processor.process(prompt, None, processor.load_images(images))[1]
        for prompt, images in _cases(family)
    ]
    for chunk in CHUNKS:
        if all(_cuts(items, chunk) for items in prompts):
            return chunk
    raise AssertionError(f"no chunk size in {CHUNKS} cuts an image of every prompt")


def _cuts(items: list[MultimodalItem], chunk: int) -> bool:
    """Whether a chunk boundary (of a prompt run alone) falls inside one of ``items``."""
    return any(item.start % chunk + item.end - item.start > chunk for item in items)


def _cases(family: str) -> list[tuple[str, list]]:
    ph = placeholder(family)
    lone, wide, tall = make_image(1, 48, 48), make_image(2, 96, 40), make_image(3, 40, 88)
    return [
        (f"Describe {ph} in a few words.", [lone]),
        (f"Compare {ph} with {ph} please.", [wide, lone]),
        (f"First {ph} then {ph} and last {ph} compare them.", [tall, wide, lone]),
    ]


@functools.cache
def _refs(family: str) -> list[tuple[list[int], list[float]]]:
    return [hf_greedy(family, prompt, images, MAX_NEW) for prompt, images in _cases(family)]


def _generate_batch(engine: sglang.Engine, family: str) -> None:
    cases = _cases(family)
    prompts, images = [p for p, _ in cases], [i for _, i in cases]
    outs = engine.generate(prompts, GREEDY, image_data=images, return_logprob=True)
    for out, ref in zip(outs, _refs(family)):
        _assert_matches(out, ref)


def _assert_matches(out: dict, ref: tuple[list[int], list[float]]) -> None:
    ref_ids, ref_logprobs = ref
    assert out["output_ids"] == ref_ids
    got = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
    assert got == pytest.approx(ref_logprobs, abs=2e-4)


def _distinct_items(engine: sglang.Engine, cases: list[tuple[str, list]]) -> int:
    processor = engine.processor
    hashes = {
        item.hash
        for prompt, images in cases
        for item in processor.process(prompt, None, processor.load_images(images))[1]
    }
    return len(hashes)


@pytest.mark.parametrize("family", ALL_VLM_FAMILIES)
def test_one_two_three_images_batched_chunked_and_cached(family: str) -> None:
    cases, refs = _cases(family), _refs(family)
    engine = _engine(family)
    embedder = engine.runner.embedder
    encoded = embedder.stats.encoded_items
    _generate_batch(engine, family)
    # one entry per image, and per context where the embedding depends on the other images
    context_dependent = engine.runner.adapter.item_context(1) != {}
    assert embedder.stats.encoded_items - encoded == _distinct_items(engine, cases)
    assert _distinct_items(engine, cases) == (4 if context_dependent else 3)
    # layouts known per size and context, embeddings cached: nothing is preprocessed again
    preprocessed = (engine.processor.preprocessor, embedder.preprocess)
    counts = [p.num_preprocessed for p in preprocessed]
    for (prompt, imgs), ref in zip(cases, refs):
        again = engine.generate(prompt, GREEDY, image_data=imgs, return_logprob=True)
        _assert_matches(again, ref)
        meta = again["meta_info"]
        assert meta["cached_tokens"] == meta["prompt_tokens"] - 1
    assert [p.num_preprocessed for p in preprocessed] == counts
    engine.scheduler.check_integrity()


# 3 cuts LLaVA-OneVision's 5-token images of several
@pytest.mark.parametrize("mode, chunk", [("per-image", -1), ("combined", 3), ("off", 3)])
def test_context_dependent_family_unchunked_and_in_the_other_cache_modes(
    mode: str, chunk: int
) -> None:
    """Unchunked, the three prompts' images are encoded in one step: one call per context."""
    family = "llava_onevision"
    engine = sglang.Engine(
        dtype="float32",
        model_path=model_dir(family),
        chunked_prefill_size=chunk,
        mm_cache_mode=mode,
    )
    _generate_batch(engine, family)
    if chunk == -1:
        assert engine.runner.embedder.stats.encoder_calls == 2
    _generate_batch(engine, family)  # from the cached prefixes
    engine.scheduler.check_integrity()


def _processor(family: str) -> MultimodalProcessor:
    path = model_dir(family)
    return MultimodalProcessor(path, AutoConfig.from_pretrained(path))


def _both_ways(
    processor: MultimodalProcessor, prompt: str, images: list, monkeypatch
) -> tuple[tuple, tuple, bool]:
    """(ids, spans) as processed, the same with the expanded text tokenized whole, and whether
    the first took the short path (``_expanded_ids`` gave the ids)."""
    loaded = processor.load_images(images)
    results = []
    original = processor._expanded_ids

    def spy(*args):
        results.append(original(*args))
        return results[-1]

    with monkeypatch.context() as m:
        m.setattr(processor, "_expanded_ids", spy)
        ids, items = processor.process(prompt, None, loaded)
    with monkeypatch.context() as m:
        m.setattr(processor, "_expanded_ids", lambda *args: None)
        whole_ids, whole_items = processor.process(prompt, None, loaded)
    short = any(r is not None for r in results)
    return (ids, [i.spans for i in items]), (whole_ids, [i.spans for i in whole_items]), short


@pytest.mark.parametrize("family", ALL_VLM_FAMILIES)
def test_ids_expanded_from_the_short_prompt_equal_the_expanded_text_tokenized(
    family: str, monkeypatch
) -> None:
    """Where every image's replacement is its placeholder token repeated (and that token is one
    added token), the prompt is tokenized before expansion and the placeholder ids repeated:
    the ids and image spans are those of tokenizing the expanded text. Elsewhere the short path
    must not be taken."""
    processor = _processor(family)
    args = _expansion_args(processor, family)
    placeholder_text, replacements = args[1], args[2]
    added = processor.tokenizer.get_added_vocab().get(placeholder_text)
    step = len(placeholder_text)
    repeated = all(r and r == placeholder_text * (len(r) // step) for r in replacements)
    expected = repeated and added == processor.adapter.image_token_id
    for prompt, images in _cases(family):
        fast, whole, short = _both_ways(processor, prompt, images, monkeypatch)
        assert short == expected, (replacements[0][:80], added)
        assert fast == whole


def _expansion_args(processor: MultimodalProcessor, family: str) -> tuple:
    prompt, images = _cases(family)[1]
    prompt = processor.adapter.format_prompt(processor.hf_processor, prompt)
    context = processor.adapter.item_context(len(images))
    replacements = [processor._item(img, context)[1] for img in processor.load_images(images)]
    return prompt, processor.hf_processor.image_token, replacements, True


@settings(max_examples=examples(40), deadline=None)
@given(
    texts=st.lists(
        st.lists(st.sampled_from([*"ab .,\n\t", "é", "日", "<|im_end|>", "<|vision_end|>"])).map(
            "".join
        ),
        min_size=3,
        max_size=3,
    ),
    sizes=st.lists(st.tuples(st.integers(28, 120), st.integers(28, 120)), min_size=2, max_size=2),
)
def test_short_prompt_expansion_on_any_text_around_the_images(texts, sizes) -> None:
    """Text of any kind next to the placeholders (spaces, newlines, special tokens) tokenizes
    the same before and after the expansion."""
    family = "qwen2_5_vl"
    processor = _qwen_processor()
    ph = placeholder(family)
    prompt = f"{texts[0]}{ph}{texts[1]}{ph}{texts[2]}"
    images = [make_image(i, w, h) for i, (w, h) in enumerate(sizes)]
    loaded = processor.load_images(images)
    original = processor._expanded_ids
    short: list = []
    try:
        processor._expanded_ids = lambda *args: short.append(original(*args)) or short[-1]
        ids, items = processor.process(prompt, None, loaded)
        assert short and short[-1] is not None  # the short path served the first
        processor._expanded_ids = lambda *args: None
        whole_ids, whole_items = processor.process(prompt, None, loaded)
    finally:
        processor._expanded_ids = original
    assert ids == whole_ids
    assert [i.spans for i in items] == [i.spans for i in whole_items]


@functools.cache
def _qwen_processor() -> MultimodalProcessor:
    return _processor("qwen2_5_vl")
