"""Qwen3.5 and Qwen3.5-MoE (Gated DeltaNet linear attention + full attention) and LFM3-VL (gated
short convolutions + attention): greedy output equals HF ``generate`` across chunk sizes that cut
images and the layers' 64-token recurrence chunks, in mixed batches, on radix hits resumed from
state snapshots and in multi-turn chats."""

from __future__ import annotations

import pytest
import torch
from conftest import HYBRID_FAMILIES, hf_greedy, make_image, model_dir, placeholder

import sglang

MAX_NEW = 8
GREEDY = {"temperature": 0, "max_new_tokens": MAX_NEW}
PH = placeholder("qwen3_5")
# Long enough that HF's chunked delta rule (64-token chunks) runs over several chunks.
FILLER = "the quick brown fox jumps over the lazy dog while the cat sat on the mat " * 3

_engines: dict[tuple, sglang.Engine] = {}


def engine(family: str, chunk: int, **kwargs) -> sglang.Engine:
    """Engines shared by the tests of this module (the radix cache carries over: tests that
    need a cold cache flush it)."""
    key = (family, chunk, tuple(sorted(kwargs.items())))
    if key not in _engines:
        _engines[key] = sglang.Engine(
            model_path=model_dir(family), chunked_prefill_size=chunk, dtype="float32", **kwargs
        )
    return _engines[key]


def assert_matches(out: dict, ref: tuple[list[int], list[float]]) -> None:
    ref_ids, ref_logprobs = ref
    assert out["output_ids"] == ref_ids
    got = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
    assert got == pytest.approx(ref_logprobs, abs=2e-4)


def generate(eng: sglang.Engine, prompt: str, images: list, **params) -> dict:
    return eng.generate(prompt, {**GREEDY, **params}, image_data=images, return_logprob=True)


CASES = [
    (f"Describe {PH} in a few words: {FILLER}", [make_image(1, 64, 64)]),
    (f"First {PH} then {PH} compare them.", [make_image(2, 96, 64), make_image(3, 64, 128)]),
]


# 11 cuts every image (16 and 20 tokens); 61 ends chunks off the delta rule's 64-token grid.
@pytest.mark.parametrize(
    "family, chunks",
    [
        ("qwen3_5", (-1, 11, 61)),
        ("qwen3_5_moe", (-1, 11)),
        ("lfm3_vl", (-1, 11)),
        ("minicpmv4_6", (-1, 11)),  # PH holds their <|image_pad|> placeholder
        ("minicpmv4_7", (-1, 11)),
    ],
)
def test_parity_across_chunk_sizes_and_snapshot_hits(family: str, chunks: tuple[int, ...]) -> None:
    refs = [hf_greedy(family, prompt, images, MAX_NEW) for prompt, images in CASES]
    for chunk in chunks:
        eng = engine(family, chunk)
        eng.flush_cache()
        for (prompt, images), ref in zip(CASES, refs):
            first = generate(eng, prompt, images)
            assert_matches(first, ref)
            assert first["meta_info"]["cached_tokens"] == 0
            restored = eng.scheduler.states.restored
            again = generate(eng, prompt, images)
            assert_matches(again, ref)
            assert again["meta_info"]["cached_tokens"] == again["meta_info"]["prompt_tokens"] - 1
            assert eng.scheduler.states.restored == restored + 1
        eng.scheduler.check_integrity()


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_mixed_batch_keeps_each_requests_state_apart(family: str) -> None:
    prompts = [
        f"One {PH} image here.",
        f"Only text in this request, a little longer than the others: {FILLER}",
        f"Two {PH} and {PH} images.",
    ]
    images = [[make_image(4, 64, 96)], [], [make_image(5), make_image(6, 128, 64)]]
    refs = [hf_greedy(family, p, imgs, MAX_NEW) for p, imgs in zip(prompts, images)]
    eng = engine(family, 24)
    eng.flush_cache()
    sizes: list[tuple[bool, int]] = []
    forward = eng.runner.forward

    def recording_forward(batch):
        sizes.append((batch.is_decode, len(batch.reqs)))
        return forward(batch)

    eng.runner.forward = recording_forward
    try:
        outs = eng.generate(prompts, GREEDY, image_data=images, return_logprob=True)
    finally:
        eng.runner.forward = forward
    for out, ref in zip(outs, refs):
        assert_matches(out, ref)
    assert max(n for decode, n in sizes if not decode) >= 2  # prompt chunks shared a step
    assert max(n for decode, n in sizes if decode) >= 2  # and so did decoding
    eng.scheduler.check_integrity()


def chat_prompt(eng: sglang.Engine, messages: list[dict]) -> str:
    return eng.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_three_turn_image_chat_resumes_from_snapshots(family: str) -> None:
    eng = engine(family, 16)
    eng.flush_cache()
    turn_start = eng.tokenizer.convert_tokens_to_ids("<|im_start|>")
    messages: list[dict] = []
    images, history_end = [], 0
    for turn in range(3):
        images.append(make_image(20 + turn, 64 + 32 * turn, 64))
        text = "Describe this image." if turn == 0 else f"And this one, turn {turn}?"
        messages.append(
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}
        )
        prompt = chat_prompt(eng, messages)
        encoded = eng.runner.embedder.stats.encoded_items
        out = generate(eng, prompt, images)
        assert_matches(out, hf_greedy(family, prompt, images, MAX_NEW))
        cached = out["meta_info"]["cached_tokens"]
        # Later turns resume where the previous prompt's history ended (before its last turn
        # header), and the per-image cache encodes only the new image.
        assert cached >= history_end and (turn == 0 or cached > 0)
        assert eng.runner.embedder.stats.encoded_items - encoded == 1
        ids = eng.processor.process(prompt, None, eng.processor.load_images(images))[0]
        history_end = len(ids) - 1 - ids[::-1].index(turn_start)
        messages.append({"role": "assistant", "content": out["text"]})
    eng.scheduler.check_integrity()


def test_snapshot_budget_evicts_least_recently_used() -> None:
    family = "qwen3_5"
    slot = engine(family, 7).runner.state_pool.bytes_per_slot
    eng = engine(family, 9, state_snapshot_mb=3.5 * slot / 2**20)
    prompts = [f"Prompt number {i} with {PH} an image and words." for i in range(4)]
    outs = [generate(eng, p, [make_image(30 + i)]) for i, p in enumerate(prompts)]
    stats = eng.scheduler.states.stats()
    assert stats["snapshot_capacity"] == 3 and stats["snapshots"] <= 3
    assert stats["snapshot_evictions"] > 0
    again = generate(eng, prompts[-1], [make_image(33)])  # the newest snapshots survived
    assert again["output_ids"] == outs[-1]["output_ids"]
    assert again["meta_info"]["cached_tokens"] == again["meta_info"]["prompt_tokens"] - 1
    oldest = generate(eng, prompts[0], [make_image(30)])
    assert_matches(oldest, hf_greedy(family, prompts[0], [make_image(30)], MAX_NEW))
    eng.scheduler.check_integrity()


def test_without_snapshots_nothing_is_reused_and_all_state_is_freed() -> None:
    family = "qwen3_5"
    prompt, images = CASES[1]
    ref = hf_greedy(family, prompt, images, MAX_NEW)
    for kwargs in ({"disable_radix_cache": True}, {"state_snapshot_mb": 0}):
        eng = engine(family, -1, **kwargs)
        for _ in range(2):
            out = generate(eng, prompt, images)
            assert_matches(out, ref)
            assert out["meta_info"]["cached_tokens"] == 0
        eng.scheduler.check_integrity()
        pool = eng.runner.state_pool
        assert pool.available_size() == pool.size


def test_failed_step_aborts_its_requests_and_frees_their_state() -> None:
    family = "qwen3_5"
    eng = engine(family, 7)
    eng.flush_cache()
    prompt, images = CASES[0]
    forward, calls = eng.runner.forward, []

    def failing_forward(batch):
        calls.append(1)
        if len(calls) == 3:  # in the middle of the chunked prefill
            raise RuntimeError("injected")
        return forward(batch)

    eng.runner.forward = failing_forward
    try:
        out = generate(eng, prompt, images)
    finally:
        eng.runner.forward = forward
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    eng.scheduler.check_integrity()
    retry = generate(eng, prompt, images)  # resumes from the snapshot of chunk 2 at best
    assert_matches(retry, hf_greedy(family, prompt, images, MAX_NEW))
    assert 0 < retry["meta_info"]["cached_tokens"] <= 14
    eng.scheduler.check_integrity()


def _fail_once(obj, name: str, calls: list):
    """Patch ``obj.name`` to raise on its first call."""
    original = getattr(obj, name)

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected")
        return original(*args, **kwargs)

    setattr(obj, name, failing)
    return original


def test_batch_failure_retries_only_requests_whose_state_is_untouched() -> None:
    family = "qwen3_5"
    eng = engine(family, -1)
    prompts = [f"Batch {PH} failure case one.", f"Batch {PH} failure case two, longer."]
    images = [[make_image(50)], [make_image(51, 96, 64)]]
    refs = [hf_greedy(family, p, imgs, MAX_NEW) for p, imgs in zip(prompts, images)]
    # Before the language model: no state changed, each request reruns alone and is correct.
    eng.flush_cache()
    calls: list = []
    original = _fail_once(eng.runner.embedder, "embed", calls)
    try:
        outs = eng.generate(prompts, GREEDY, image_data=images, return_logprob=True)
    finally:
        eng.runner.embedder.embed = original
    assert len(calls) == 3  # the batch, then each request alone
    for out, ref in zip(outs, refs):
        assert_matches(out, ref)
    # In the full-attention layer: the linear layers before it have changed both states.
    eng.flush_cache()
    attention = eng.runner.adapter.language_model.layers[3].self_attn
    calls = []
    original = _fail_once(attention, "forward", calls)
    try:
        outs = eng.generate(prompts, GREEDY, image_data=images)
    finally:
        attention.forward = original
    assert len(calls) == 1  # neither request is rerun on its half-written state
    assert [o["meta_info"]["finish_reason"]["type"] for o in outs] == ["abort", "abort"]
    eng.scheduler.check_integrity()
    assert eng.runner.state_pool.available_size() == eng.runner.state_pool.size
    assert_matches(generate(eng, prompts[1], images[1]), refs[1])


def test_kv_pool_holds_full_attention_layers_only() -> None:
    eng = engine("qwen3_5", 7)
    text = eng.runner.text_config
    full = [t for t in text.layer_types if t == "full_attention"]
    assert len(eng.runner.kv_pool.k_buffer) == len(full) < text.num_hidden_layers
    shape = eng.runner.state_pool.shape
    assert len(shape.layer_ids) == text.num_hidden_layers - len(full)
    assert shape.recurrent_dtype == torch.float32  # as HF keeps it


def test_minicpmv4_7_canvas_positions_match_hf() -> None:
    """MiniCPM-V 4.7's canvas M-RoPE (markers pinned to the image canvas) from the engine's
    layouts equals HF's from its processor outputs, for images with and without slices (the
    tiny Qwen3.5 LM hardly depends on positions, so parity alone would not show it)."""
    from conftest import _hf, hf_inputs

    family = "minicpmv4_7"
    ph = placeholder(family)
    model, processor = _hf(family)
    eng = engine(family, -1)
    prompt = f"First {ph} then {ph} and {ph}."
    images = [make_image(2, 96, 40), make_image(3, 40, 88), make_image(4, 200, 120)]
    inputs = hf_inputs(processor, prompt, images)
    want, want_delta = model.model.get_rope_index(
        inputs["input_ids"],
        mm_token_type_ids=inputs["mm_token_type_ids"],
        target_sizes=inputs["target_sizes"],
    )
    ids, items = eng.processor.process(prompt, None, eng.processor.load_images(images))
    assert ids == inputs["input_ids"][0].tolist()
    assert len(inputs["target_sizes"]) > len(images)  # one image is sliced
    got, delta = eng.runner.adapter.mrope(ids, [item.layout for item in items])
    assert torch.equal(got, want[:, 0]) and delta == int(want_delta.reshape(-1)[0])
