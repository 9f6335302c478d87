"""Offline engine API: inputs, outputs, stop conditions, errors, admission control."""

from __future__ import annotations

import base64
import io
import re
import time

import pytest
from conftest import hf_greedy, make_image, model_dir, placeholder

import sglang
from sglang.srt.multimodal.image_io import ImageError

FAMILY = "qwen2_5_vl"
GREEDY = {"temperature": 0, "max_new_tokens": 8}


@pytest.fixture(scope="module")
def engine() -> sglang.Engine:
    return sglang.Engine(
        dtype="float32", model_path=model_dir(FAMILY), chunked_prefill_size=32, random_seed=0
    )


def _png_bytes(seed: int) -> bytes:
    buf = io.BytesIO()
    make_image(seed).save(buf, format="PNG")
    return buf.getvalue()


def test_image_input_formats_agree(engine: sglang.Engine, tmp_path) -> None:
    data = _png_bytes(20)
    path = tmp_path / "img.png"
    path.write_bytes(data)
    b64 = base64.b64encode(data).decode()
    prompt = f"What is {placeholder(FAMILY)} this?"
    sources = [str(path), data, b64, f"data:image/png;base64,{b64}", make_image(20)]
    outs = [engine.generate(prompt, GREEDY, image_data=src) for src in sources]
    assert all(o["output_ids"] == outs[0]["output_ids"] for o in outs)
    # Path, bytes and base64 carry the same raw bytes: same hash, so KV is reused in full.
    assert outs[1]["meta_info"]["cached_tokens"] == outs[1]["meta_info"]["prompt_tokens"] - 1


def test_batched_inputs_and_input_ids(engine: sglang.Engine) -> None:
    ph = placeholder(FAMILY)
    prompts = [f"A {ph} b", "plain text", f"{ph}{ph} two"]
    images = [make_image(1), None, [make_image(2), make_image(3, 32, 64)]]
    params = [GREEDY, {"temperature": 0, "max_new_tokens": 3}, GREEDY]
    outs = engine.generate(prompts, params, image_data=images)
    assert isinstance(outs, list) and len(outs) == 3
    assert outs[1]["meta_info"]["completion_tokens"] == 3
    for prompt, imgs, out in zip(prompts, images, outs):
        imgs = [] if imgs is None else imgs if isinstance(imgs, list) else [imgs]
        assert out["output_ids"][:3] == hf_greedy(FAMILY, prompt, imgs, 3)[0]
    ids = engine.tokenizer("plain text")["input_ids"]
    by_ids = engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 3})
    assert by_ids["output_ids"] == outs[1]["output_ids"]


def test_stop_conditions(engine: sglang.Engine) -> None:
    prompt = "The quick brown fox"
    free = engine.generate(prompt, {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True})
    assert free["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
    third = free["output_ids"][2]
    by_id = engine.generate(
        prompt, {"temperature": 0, "max_new_tokens": 12, "stop_token_ids": [third]}
    )
    assert by_id["output_ids"] == free["output_ids"][:3]
    assert by_id["meta_info"]["finish_reason"] == {"type": "stop", "matched": third}
    text = free["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    if stop.strip():
        by_str = engine.generate(prompt, {"temperature": 0, "max_new_tokens": 12, "stop": stop})
        assert by_str["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
        assert stop not in by_str["text"] and text.startswith(by_str["text"])


def _first_match(tokenizer, ids: list[int], pattern: str) -> int:
    """The fewest output tokens whose text matches ``pattern``."""
    return next(t for t in range(1, len(ids) + 1) if re.search(pattern, tokenizer.decode(ids[:t])))


def test_stop_regex_ends_at_the_first_match_and_keeps_it(engine: sglang.Engine) -> None:
    prompt, base = (
        "The quick brown fox",
        {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True},
    )
    free = engine.generate(prompt, base)
    ids, text = free["output_ids"], free["text"]
    k = len(text) // 2
    bounded = re.escape(text[k]) + r"[\s\S]" + re.escape(text[k + 2])
    unbounded = re.escape(text[k]) + r"[\s\S]*" + re.escape(text[k + 2])
    for pattern in (bounded, unbounded, [r"\A\Z", bounded]):
        out = engine.generate(prompt, {**base, "stop_regex": pattern})
        matched = pattern if isinstance(pattern, str) else pattern[1]
        t = _first_match(engine.tokenizer, ids, matched)
        assert out["output_ids"] == ids[:t]
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": matched}
        assert out["text"] == engine.tokenizer.decode(ids[:t])  # SGLang keeps the match
        assert re.search(matched, out["text"])


def test_logprob_keys_are_sglangs(engine: sglang.Engine) -> None:
    meta = engine.generate("Hi", GREEDY, return_logprob=True, top_logprobs_num=2)["meta_info"]
    assert meta["input_token_logprobs"] == [] == meta["input_top_logprobs"]
    assert meta["output_token_logprobs_length"] == len(meta["output_top_logprobs"]) == 8
    assert all(len(entry) == 3 and entry[2] is None for entry in meta["output_token_logprobs"])


def test_skip_special_tokens_and_spaces_between_them(engine: sglang.Engine) -> None:
    end = engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
    params = {**GREEDY, "max_new_tokens": 3, "ignore_eos": True, "logit_bias": {str(end): 100}}
    out = engine.generate("Hi", params)
    assert out["output_ids"] == [end] * 3 and out["text"] == ""
    kept = engine.generate("Hi", {**params, "skip_special_tokens": False})
    assert kept["text"] == "<|im_end|>" * 3


def test_decode_passes_spaces_between_special_tokens_to_the_tokenizer() -> None:
    from sglang.srt.core.finish import FinishReason
    from sglang.srt.managers.detokenizer import IncrementalDetokenizer
    from sglang.srt.sampling.sampling_params import SamplingParams

    class Recorder:
        def decode(self, ids: list[int], **kwargs) -> str:
            self.kwargs = kwargs
            return "a</s> b"

    tok = Recorder()
    params = SamplingParams.from_dict({"spaces_between_special_tokens": False, "stop": " b"})
    detokenizer = IncrementalDetokenizer(tok, params)
    assert detokenizer.finish(FinishReason.stop(" b"), [1, 2]) == "a</s>"
    assert tok.kwargs == {"skip_special_tokens": True, "spaces_between_special_tokens": False}


def test_seeded_sampling_is_reproducible(engine: sglang.Engine) -> None:
    params = {"temperature": 1.0, "top_p": 0.9, "max_new_tokens": 8, "seed": 7}
    a = engine.generate("Once upon a time", params)
    b = engine.generate("Once upon a time", params)
    c = engine.generate("Once upon a time", {**params, "seed": 8})
    assert a["output_ids"] == b["output_ids"]
    assert a["output_ids"] != c["output_ids"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"prompt": "hi", "sampling_params": {"temperature": -1}}, "temperature"),
        ({"prompt": "hi " * 5000, "sampling_params": {}}, "context length"),
        ({"prompt": "x", "image_data": b"not an image"}, "cannot decode"),
        ({"prompt": "x", "image_data": "%%%notbase64"}, "neither valid base64"),
        ({"prompt": ["a", "b"], "image_data": [None]}, "one entry per prompt"),
        ({"prompt": None}, "exactly one"),
    ],
)
def test_bad_input_raises_and_changes_nothing(engine: sglang.Engine, kwargs, match) -> None:
    before = engine.generate("steady", GREEDY)
    with pytest.raises(ValueError, match=match):
        engine.generate(**kwargs)
    assert not engine.scheduler.running and not engine.scheduler.waiting
    engine.scheduler.check_integrity()
    assert engine.generate("steady", GREEDY)["output_ids"] == before["output_ids"]


def test_corrupt_image_is_an_image_error(engine: sglang.Engine) -> None:
    with pytest.raises(ImageError):
        engine.generate(f"x {placeholder(FAMILY)}", GREEDY, image_data=_png_bytes(1)[:60])


def test_image_limit_and_text_model_rejects_images() -> None:
    eng = sglang.Engine(
        dtype="float32", model_path=model_dir(FAMILY), limit_mm_data_per_request='{"image": 1}'
    )
    ph = placeholder(FAMILY)
    with pytest.raises(ValueError, match="limit"):
        eng.generate(f"{ph}{ph}", GREEDY, image_data=[make_image(1), make_image(2)])
    text_engine = sglang.Engine(dtype="float32", model_path=model_dir("qwen2"))
    with pytest.raises(ValueError, match="does not accept images"):
        text_engine.generate("hello", GREEDY, image_data=make_image(1))


def test_flush_cache_and_server_info(engine: sglang.Engine) -> None:
    prompt = f"Flush {placeholder(FAMILY)} test prompt"
    engine.generate(prompt, GREEDY, image_data=make_image(30))
    hit = engine.generate(prompt, GREEDY, image_data=make_image(30))
    assert hit["meta_info"]["cached_tokens"] > 0
    assert engine.flush_cache()
    miss = engine.generate(prompt, GREEDY, image_data=make_image(30))
    assert miss["meta_info"]["cached_tokens"] == 0
    assert miss["output_ids"] == hit["output_ids"]
    info = engine.get_server_info()
    assert info["model_path"] == model_dir(FAMILY) and "api_key" not in info
    mm = info["mm_embedding_cache"]
    assert mm["mode"] == "per-image" and mm["encoded_items"] >= 1 and mm["entries"] >= 1


def test_disable_radix_cache_reports_no_hits() -> None:
    eng = sglang.Engine(dtype="float32", model_path=model_dir(FAMILY), disable_radix_cache=True)
    first = eng.generate("same prompt twice", GREEDY)
    second = eng.generate("same prompt twice", GREEDY)
    assert second["meta_info"]["cached_tokens"] == 0
    assert first["output_ids"] == second["output_ids"]
    eng.scheduler.check_integrity()
    assert eng.runner.kv_pool.available_size() == eng.runner.kv_pool.size


def test_admission_control_queues_when_kv_is_short() -> None:
    eng = sglang.Engine(
        dtype="float32", model_path=model_dir(FAMILY), max_total_tokens=160, chunked_prefill_size=16
    )
    ph = placeholder(FAMILY)
    prompts = [f"request {i} {ph} with words" for i in range(6)]
    images = [make_image(40 + i) for i in range(6)]
    solo = [eng.generate(p, GREEDY, image_data=img) for p, img in zip(prompts, images)]
    eng.flush_cache()
    peak = []
    original = eng.scheduler.step

    def step():
        peak.append(len(eng.scheduler.running))
        return original()

    eng.scheduler.step = step
    outs = eng.generate(prompts, GREEDY, image_data=images)
    assert [o["output_ids"] for o in outs] == [s["output_ids"] for s in solo]
    assert 1 <= max(peak) < len(prompts)  # not everything fit at once: requests waited
    eng.scheduler.check_integrity()


def test_request_larger_than_kv_pool_is_rejected() -> None:
    eng = sglang.Engine(dtype="float32", model_path=model_dir(FAMILY), max_total_tokens=32)
    with pytest.raises(ValueError, match="KV slots"):
        eng.generate("word " * 40, GREEDY)
    assert eng.generate("short", {"temperature": 0, "max_new_tokens": 4})["output_ids"]


def test_gemma3_never_splits_an_image_across_chunks() -> None:
    family = "gemma3"
    ph = placeholder(family)
    eng = sglang.Engine(dtype="float32", model_path=model_dir(family), chunked_prefill_size=7)
    chunks = []
    original = eng.runner.forward

    def forward(batch):
        chunks.extend(
            (req, p, p + e) for req, p, e in zip(batch.reqs, batch.prefix_lens, batch.extend_lens)
        )
        return original(batch)

    eng.runner.forward = forward
    prompt = f"a {ph} b {ph} c"
    images = [make_image(50), make_image(51)]
    out = eng.generate(prompt, GREEDY, image_data=images)
    assert out["output_ids"] == hf_greedy(family, prompt, images, 8)[0]
    for req, lo, hi in chunks:
        for item in req.mm_items:
            assert not (item.start < lo < item.end or item.start < hi < item.end)
    assert any(hi - lo > 7 for _, lo, hi in chunks)  # an image made a chunk exceed the budget


def test_the_default_model_reads_the_demos_line_and_reuses_its_embedding() -> None:
    """No model path: the packaged OCR reader, on the engine's default settings, reads the line
    the demo draws; asked again with no prefix cache, the whole prompt is prefilled again and
    the image's embedding comes from the per-image cache (one encode in all)."""
    from scripts.demo import DEMO_TEXT, ask_twice, draw_text
    from sglang.srt.entrypoints.default_model import DEFAULT_MODEL_DIR

    with sglang.Engine(disable_radix_cache=True) as eng:
        assert eng.server_args.model_path == str(DEFAULT_MODEL_DIR)
        first, second = ask_twice(eng, draw_text(DEMO_TEXT))
    assert first["text"] == second["text"] == DEMO_TEXT
    assert (first["cache"]["misses"], first["cache"]["hits"]) == (1, 0)
    assert (second["cache"]["misses"], second["cache"]["hits"]) == (1, 1)
    assert second["cached_tokens"] == 0


def test_rendered_chat_prompt_keeps_a_single_bos() -> None:
    from types import SimpleNamespace

    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.entrypoints.openai.serving_chat import render_chat as _render_chat
    from sglang.srt.server_args import ServerArgs

    eng = sglang.Engine(dtype="float32", model_path=model_dir("gemma3"))
    bos, bos_id = eng.tokenizer.bos_token, eng.tokenizer.bos_token_id
    body = ChatCompletionRequest(
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "unused"}},
                    {"type": "text", "text": "hi"},
                ],
            }
        ]
    )
    prompt, images, _, _ = _render_chat(
        SimpleNamespace(tokenizer=eng.tokenizer), body, ServerArgs()
    )
    assert prompt.startswith(bos) and images == ["unused"]
    loaded = eng.processor.load_images([make_image(1)])
    doubled, _ = eng.processor.process(prompt, None, loaded)
    single, _ = eng.processor.process(prompt, None, loaded, add_special_tokens=False)
    assert doubled[:2] == [bos_id, bos_id] and single.count(bos_id) == 1


def test_perf_counters_count_prefill_flops_and_decode_time_apart() -> None:
    """A round's FLOPs are its prefill's: linears over the prompt's tokens, the head over one
    row, causal attention over the prompt; decode steps add time and bytes, no FLOPs."""
    engine = sglang.Engine(dtype="float32", model_path=model_dir("qwen2"))
    runner = engine.runner
    text = runner.text_config
    ids = [[11 + (7 * i) % 300 for i in range(40)]]
    engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 5})
    perf = runner.perf
    # By hand from the config: per layer q, k, v, o and the gated MLP's three matrices.
    hidden, heads, kv_heads = text.hidden_size, text.num_attention_heads, text.num_key_value_heads
    dim = getattr(text, "head_dim", None) or hidden // heads
    attention = hidden * (2 * heads * dim + 2 * kv_heads * dim)
    per_layer = attention + 3 * hidden * text.intermediate_size
    assert perf.lm_linear_flops == 2.0 * 40 * text.num_hidden_layers * per_layer
    assert perf.lm_head_flops == 2.0 * 1 * hidden * text.vocab_size
    # QK^T and PV: 2 x 2 x dim per (head, query, key); query i sees keys 0..i.
    keys_seen = sum(range(1, 41))
    want = text.num_hidden_layers * 4.0 * heads * dim * keys_seen
    assert perf.lm_attention_flops == pytest.approx(want)
    assert perf.decode_steps == 4 and perf.decode_attention_seconds > 0
    engine.shutdown()


def test_nan_logits_fail_their_request_alone(engine: sglang.Engine) -> None:
    """A NaN anywhere in a request's logits row (here one vocabulary entry, not the largest)
    ends that request with an error; the other request of the batch decodes as it would alone."""
    prompts = ["plain text", "another prompt"]
    alone = engine.generate(prompts[1], GREEDY)["output_ids"]
    forward = engine.runner.forward

    def nan_forward(batch):
        logits = forward(batch)
        for row, req in enumerate(batch.reqs):
            if req.sampling_params.max_new_tokens == 5 and len(req.output_ids) == 2:
                logits[row, 7] = float("nan")
        return logits

    engine.runner.forward = nan_forward
    try:
        failed, kept = engine.generate(prompts, [{"temperature": 0, "max_new_tokens": 5}, GREEDY])
    finally:
        engine.runner.forward = forward
    assert failed["meta_info"]["finish_reason"]["type"] == "abort"
    assert "NaN" in failed["meta_info"]["finish_reason"]["message"]
    assert len(failed["output_ids"]) == 2
    assert kept["output_ids"] == alone
    assert kept["meta_info"]["finish_reason"]["type"] == "length"
    engine.scheduler.check_integrity()


def test_sglang_waiting_and_running_timeouts_end_requests_with_503(monkeypatch) -> None:
    """SGLANG_REQ_WAITING_TIMEOUT: with one request running at a time, the queued one ends with a
    503 once it has waited longer; SGLANG_REQ_RUNNING_TIMEOUT ends a running one, its KV given
    back."""
    monkeypatch.setenv("SGLANG_REQ_WAITING_TIMEOUT", "0.2")
    eng = sglang.Engine(dtype="float32", model_path=model_dir("qwen2"), max_running_requests=1)
    params = {"temperature": 0, "max_new_tokens": 64, "ignore_eos": True}
    tokenized, _ = eng.tokenize(["first one", "second one"], params, None, None)
    first, second = [eng.scheduler.add_request(t) for t in tokenized]
    eng.scheduler.step()
    assert first in eng.scheduler.running and second in eng.scheduler.waiting
    time.sleep(0.3)
    ended = eng.scheduler.step().reqs
    assert second in ended and second.finish_reason.status_code == 503
    assert second.finish_reason.message == "Request waiting timeout reached."
    while not first.finished:
        eng.scheduler.step()
    assert first.finish_reason.kind == "length" and len(first.output_ids) == 64

    eng.scheduler.waiting_timeout, eng.scheduler.running_timeout = None, 0.2
    (third,) = [eng.scheduler.add_request(t) for t in eng.tokenize("third", params, None, None)[0]]
    eng.scheduler.step()
    time.sleep(0.3)
    assert third in eng.scheduler.step().reqs and third.finish_reason.status_code == 503
    assert 0 < len(third.output_ids) < 64 and not eng.scheduler.running
    eng.scheduler.check_integrity()
    assert eng.runner.kv_pool.available_size() + eng.scheduler.tree.total_size == (
        eng.runner.kv_pool.size
    )
