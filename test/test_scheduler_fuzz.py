"""No request can take the scheduler down: malformed and extreme requests, given to the
scheduler directly (past every API-side check), are rejected or aborted alone, and the engine
stays consistent and keeps serving everyone else exactly."""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools

import pytest
import torch
from conftest import examples, make_image, model_dir, placeholder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sglang
from sglang.srt.core.io_struct import TokenizedRequest
from sglang.srt.managers.scheduler import RequestFailed
from sglang.srt.sampling.sampling_params import SamplingParams

FAMILY = "qwen2_5_vl"
PH = placeholder(FAMILY)
GREEDY = {"temperature": 0, "max_new_tokens": 4}
_RIDS = itertools.count()


@functools.cache
def _engine(mixed_chunk: bool = False) -> sglang.Engine:
    return sglang.Engine(
        dtype="float32",
        model_path=model_dir(FAMILY),
        chunked_prefill_size=16,
        enable_mixed_chunk=mixed_chunk,
    )


@functools.cache
def _valid() -> list[TokenizedRequest]:
    engine = _engine()
    prompts = [f"Look {PH} at this.", "Only words here, nothing else.", f"Two {PH} and {PH}."]
    images = [[make_image(1)], [], [make_image(2, 96, 64), make_image(3)]]
    reqs, _ = engine.tokenize(prompts, GREEDY, None, images)
    return reqs


@functools.cache
def _reference(index: int) -> list[int]:
    engine = _engine()
    req = engine.scheduler.add_request(_fresh(index, f"ref-{index}"))
    while not req.finished:
        engine.scheduler.step()
    return req.output_ids


def _fresh(index: int, rid: str) -> TokenizedRequest:
    base = _valid()[index]
    return dataclasses.replace(
        base,
        rid=rid,
        input_ids=list(base.input_ids),
        sampling_params=copy.copy(base.sampling_params),
        mm_items=[copy.copy(item) for item in base.mm_items],
    )


def _wild_params(draw: st.DrawFn) -> SamplingParams:
    """Sampling values set directly, past validation."""
    sp = SamplingParams()
    inf, nan = float("inf"), float("nan")
    sp.temperature = draw(st.sampled_from([0, 1e-40, 5e-324, 0.7, 50.0, inf, nan]))
    sp.top_p = draw(st.sampled_from([1.0, 0.5, 1e-12, nan]))
    sp.top_k = draw(st.sampled_from([-1, 1, 3, 10**9]))
    sp.min_p = draw(st.sampled_from([0.0, 0.99, 1.0]))
    sp.max_new_tokens = draw(st.sampled_from([0, 1, 3]))
    sp.min_new_tokens = draw(st.sampled_from([0, 2, 50]))
    sp.frequency_penalty = draw(st.sampled_from([0.0, 2.0, -2.0]))
    sp.presence_penalty = draw(st.sampled_from([0.0, 1.5]))
    sp.repetition_penalty = draw(st.sampled_from([1.0, 2.0, 0.01]))
    sp.seed = draw(st.sampled_from([None, 0, 2**63 - 1, -5]))
    sp.stop_token_ids = draw(st.sampled_from([None, [1, 2], [10**12, -1]]))
    return sp


@st.composite
def _request(draw: st.DrawFn, rid: str) -> tuple[TokenizedRequest, bool]:
    """A request and whether it is one of the valid greedy ones (whose output is known)."""
    index = draw(st.integers(0, len(_valid()) - 1))
    req = _fresh(index, rid)
    kind = draw(st.sampled_from(["valid", "bad_ids", "no_items", "shifted", "extra_items", "wild"]))
    vocab = _engine().runner.vocab_size
    if kind == "bad_ids":
        req.input_ids[draw(st.integers(0, len(req.input_ids) - 1))] = draw(
            st.sampled_from([-1, vocab, 10**12, -(10**12)])
        )
    elif kind == "no_items":
        req.mm_items = []
    elif kind == "shifted" and req.mm_items:
        item = req.mm_items[0]
        shift = draw(st.sampled_from([-2, 1, 10**6]))
        item.spans = [(s + shift, e + shift) for s, e in item.spans]
    elif kind == "extra_items":
        req.mm_items = req.mm_items + [copy.copy(it) for it in _valid()[2].mm_items]
    elif kind == "wild":
        req.sampling_params = _wild_params(draw)
    req.return_logprob = draw(st.booleans())  # prompt logprobs change no sampled token
    req.logprob_start_len = draw(st.sampled_from([-1, 0, 5, 10**6, -7]))
    return req, kind == "valid"


@settings(
    max_examples=examples(30),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_scheduler_survives_any_mix_of_requests(data: st.DataObject) -> None:
    mixed_chunk = data.draw(st.booleans(), label="enable_mixed_chunk")
    scheduler = _engine(mixed_chunk).scheduler
    try:
        _run_mix(data, scheduler)
    finally:  # a failed example must not leave work behind for the next one
        for req in [*scheduler.waiting, *scheduler.running]:
            scheduler.abort(req.rid)


def _run_mix(data: st.DataObject, scheduler) -> None:
    n = data.draw(st.integers(1, 4))
    accepted, known = [], []
    for _ in range(n):
        tokenized, valid = data.draw(_request(f"fuzz-{next(_RIDS)}"))
        try:
            req = scheduler.add_request(tokenized)
        except (ValueError, RequestFailed):
            assert tokenized.rid not in {r.rid for r in scheduler.waiting}
            continue
        accepted.append(req)
        if valid:
            ref_index = [v.input_ids for v in _valid()].index(tokenized.input_ids)
            known.append((req, ref_index))
    for _ in range(300):
        if not scheduler.has_work:
            break
        scheduler.step()
    assert not scheduler.has_work
    assert all(req.finished for req in accepted)
    for req, ref_index in known:
        assert req.output_ids == _reference(ref_index)
    scheduler.check_integrity()
    assert scheduler.runner.embedder.cache.num_pinned == 0


def test_a_failing_encode_aborts_only_its_request(monkeypatch) -> None:
    engine = _engine()
    engine.flush_cache()
    poisoned = make_image(99)
    ph_prompts = [f"Look {PH} at this.", f"Also {PH} here.", "Plain words only."]
    refs = [_reference(0), None, _reference(1)]
    original = engine.runner.adapter.encode

    def encode(items, rows):
        if any(_is_poison(f) for f in items):
            raise RuntimeError("vision encoder failed on this image")
        return original(items, rows)

    poison_rows = engine.processor.preprocessor.features([poisoned])[0]["pixel_values"]

    def _is_poison(features) -> bool:
        pixels = features["pixel_values"]
        return pixels.shape == poison_rows.shape and torch.equal(
            torch.as_tensor(pixels), torch.as_tensor(poison_rows)
        )

    monkeypatch.setattr(engine.runner.adapter, "encode", encode)
    images = [[make_image(1)], [poisoned], []]
    prompts = [ph_prompts[0], ph_prompts[1], "Only words here, nothing else."]
    reqs, _ = engine.tokenize(prompts, GREEDY, None, images)
    running = [engine.scheduler.add_request(r) for r in reqs]
    while engine.scheduler.has_work:
        engine.scheduler.step()
    assert running[1].finish_reason.kind == "abort"
    assert running[1].finish_reason.status_code == 500
    assert running[0].output_ids == refs[0] and running[2].output_ids == refs[2]
    engine.scheduler.check_integrity()


def test_a_failing_sample_aborts_only_its_request(monkeypatch) -> None:
    from sglang.srt.managers import output_processor as scheduler_module

    engine = _engine()
    real = scheduler_module.sample

    def sample(logits, params, generators):
        if params[0].temperature == 0.5:
            raise RuntimeError("sampler exploded")
        return real(logits, params, generators)

    monkeypatch.setattr(scheduler_module, "sample", sample)
    bad = _fresh(1, "bad-sample")
    bad.sampling_params = SamplingParams.from_dict({"temperature": 0.5, "max_new_tokens": 4})
    good = _fresh(0, "good")
    reqs = [engine.scheduler.add_request(r) for r in (good, bad)]
    while engine.scheduler.has_work:
        engine.scheduler.step()
    reason = reqs[1].finish_reason
    assert reason.kind == "abort" and "sampler" in reason.message
    assert reqs[0].output_ids == _reference(0)
    engine.scheduler.check_integrity()


@pytest.mark.parametrize("max_new", [0, 1])
def test_max_new_tokens_zero_runs_the_prompt_only(max_new: int) -> None:
    engine = _engine()
    out = engine.generate("Once upon a time", {"temperature": 0, "max_new_tokens": max_new})
    assert len(out["output_ids"]) == max_new
    assert out["meta_info"]["finish_reason"]["type"] == "length"
    engine.scheduler.check_integrity()
