"""Prompt logprobs (``logprob_start_len`` on /generate and the Engine, ``echo`` with
``logprobs`` on /v1/completions) equal the log-softmax of HF's forward over the prompt, whatever
the chunk size, the start position and what the radix cache already holds."""

from __future__ import annotations

import functools
import json

import httpx
import pytest
import torch
from conftest import _hf, examples, make_image, model_dir, placeholder
from hypothesis import given, settings
from hypothesis import strategies as st
from server_utils import launch_server

import sglang

ONE_TOKEN = {"temperature": 0, "max_new_tokens": 1}
TOKEN_IDS = [5, 300, 17, 5]  # token_ids_logprob, in this order: a repeated id comes back twice


def _hf_prompt_logprobs(family: str, prompt: str | None, images: list, ids=None):
    """HF's prompt ids and, per position p >= 1, log P(token p | tokens < p) with its top 3."""
    return _chosen_and_top(*_hf_forward(family, prompt, images, ids))


def _chosen_and_top(ids: list[int], logprobs: torch.Tensor) -> tuple[list[int], list, list]:
    chosen = logprobs[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()
    top = logprobs[:-1].topk(3, dim=-1)
    return ids, [None, *chosen], [None, *zip(top.values.tolist(), top.indices.tolist())]


def _hf_forward(
    family: str, prompt: str | None, images: list, ids=None
) -> tuple[list[int], torch.Tensor]:
    """HF's prompt ids and its log-softmax at every prompt position: (len(ids), vocab)."""
    model, processor = _hf(family)
    if images:
        inputs = processor(text=[prompt], images=images, return_tensors="pt")
    elif ids is not None:
        inputs = {"input_ids": torch.tensor([ids])}
    else:
        inputs = getattr(processor, "tokenizer", processor)([prompt], return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits[0].float()
    return inputs["input_ids"][0].tolist(), torch.log_softmax(logits, -1)


def _assert_prompt_logprobs(meta: dict, ids: list[int], ref: list, start: int) -> None:
    got = meta["input_token_logprobs"]
    assert [tok for _, tok, _ in got] == ids[start:]
    assert len(got) == len(ids) - start
    for (lp, _, _), want in zip(got, ref[start:]):
        if want is None:
            assert lp is None
        else:
            assert lp == pytest.approx(want, abs=2e-4)


@functools.cache
def _engine(family: str, chunk: int) -> sglang.Engine:
    return sglang.Engine(dtype="float32", model_path=model_dir(family), chunked_prefill_size=chunk)


@pytest.mark.parametrize("chunk", [-1, 5])
@pytest.mark.parametrize("family", ["qwen2_5_vl", "gemma3", "llava", "qwen3_5"])
def test_prompt_logprobs_with_images_match_hf(family: str, chunk: int) -> None:
    ph = placeholder(family)
    prompt = f"First {ph} then {ph} compare them."
    images = [make_image(2, 96, 64), make_image(3, 64, 128)]
    ids, table = _hf_forward(family, prompt, images)
    _, ref, ref_top = _chosen_and_top(ids, table)
    engine = _engine(family, chunk)
    engine.flush_cache()
    for start in (0, 9, 0):  # the last run finds the whole prompt in the radix cache
        out = engine.generate(
            prompt,
            ONE_TOKEN,
            image_data=images,
            return_logprob=True,
            top_logprobs_num=3,
            logprob_start_len=start,
            token_ids_logprob=TOKEN_IDS,
        )
        meta = out["meta_info"]
        _assert_prompt_logprobs(meta, ids, ref, start)
        by_id = meta["input_token_ids_logprobs"]
        assert (by_id[0] is None) == (start == 0)  # nothing predicts the first token
        rows = by_id[1:] if start == 0 else by_id
        _assert_token_ids_rows(rows, table[max(start - 1, 0) : len(ids) - 1], TOKEN_IDS)
        assert meta["cached_tokens"] <= max(start - 1, 0)
        for got, want in zip(meta["input_top_logprobs"], ref_top[start:]):
            if want is None:
                assert got is None
                continue
            assert [tok for _, tok, _ in got] == want[1]
            assert [lp for lp, _, _ in got] == pytest.approx(want[0], abs=2e-4)
    engine.scheduler.check_integrity()


def test_prompt_logprobs_reuse_the_cache_before_the_start() -> None:
    engine = _engine("qwen2_5_vl", -1)
    engine.flush_cache()
    prompt = "The quick brown fox jumps over the lazy dog and the cat sat on the mat"
    ids, ref, _ = _hf_prompt_logprobs("qwen2_5_vl", prompt, [])
    engine.generate(prompt, ONE_TOKEN)
    out = engine.generate(prompt, ONE_TOKEN, return_logprob=True, logprob_start_len=10)
    assert out["meta_info"]["cached_tokens"] == 9  # the logits of token 9 predict token 10
    _assert_prompt_logprobs(out["meta_info"], ids, ref, 10)
    plain = engine.generate(prompt, ONE_TOKEN, return_logprob=True)
    assert plain["meta_info"]["input_token_logprobs"] == []
    assert plain["meta_info"]["cached_tokens"] == len(ids) - 1
    past_end = engine.generate(
        prompt, ONE_TOKEN, return_logprob=True, logprob_start_len=len(ids) + 5
    )
    assert past_end["meta_info"]["input_token_logprobs"] == []
    with pytest.raises(ValueError, match="logprob_start_len"):
        engine.generate(prompt, ONE_TOKEN, return_logprob=True, logprob_start_len=-2)
    engine.scheduler.check_integrity()


def test_prompt_logprobs_survive_a_batch_rerun_one_by_one(monkeypatch) -> None:
    """A failing batch forward reruns its requests one at a time; the prompt logprobs of that
    step must still reach every request."""
    engine = _engine("qwen2_5_vl", -1)
    engine.flush_cache()
    prompts = ["Once upon a time there was a fox", "The cat sat on the mat and looked around"]
    refs = [_hf_prompt_logprobs("qwen2_5_vl", p, [])[:2] for p in prompts]
    runner_forward = engine.runner.forward

    def forward(batch):
        if batch.size > 1:
            raise RuntimeError("this batch fails as a whole")
        return runner_forward(batch)

    monkeypatch.setattr(engine.runner, "forward", forward)
    outs = engine.generate(prompts, ONE_TOKEN, return_logprob=True, logprob_start_len=0)
    for out, (ids, ref) in zip(outs, refs):
        _assert_prompt_logprobs(out["meta_info"], ids, ref, 0)
    engine.scheduler.check_integrity()


@settings(max_examples=examples(25), deadline=None)
@given(
    ids=st.lists(st.integers(3, 500), min_size=2, max_size=40),
    start_draw=st.integers(0, 10**6),
    chunk=st.sampled_from([-1, 1, 3, 7]),
    warm_draw=st.integers(0, 10**6),
)
def test_prompt_logprobs_any_chunking_and_cached_prefix(ids, start_draw, chunk, warm_draw) -> None:
    """Random prompts, start positions and chunk sizes, after a request that leaves a random
    prefix of the prompt in the radix cache. Starts are drawn over the prompt and two past its
    end, so most examples check logprobs and about one in ten the empty answer past the end."""
    start = start_draw % (len(ids) + 2)
    warm = warm_draw % (len(ids) + 1)
    engine = _engine("llama", chunk)
    _, ref, _ = _hf_prompt_logprobs("llama", None, [], ids=ids)
    if warm:
        engine.generate(input_ids=ids[: max(warm, 1)], sampling_params=ONE_TOKEN)
    out = engine.generate(
        input_ids=ids, sampling_params=ONE_TOKEN, return_logprob=True, logprob_start_len=start
    )
    if start < len(ids):
        _assert_prompt_logprobs(out["meta_info"], ids, ref, start)
    else:
        assert out["meta_info"]["input_token_logprobs"] == []
    engine.scheduler.check_integrity()


def _hf_logprobs(family: str, ids: list[int]) -> torch.Tensor:
    """HF's log-softmax at every position of ``ids``: (len(ids), vocab)."""
    model, _ = _hf(family)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, -1)


def _assert_token_ids_rows(rows: list, ref: torch.Tensor, token_ids: list[int]) -> None:
    assert len(rows) == len(ref)
    for got, want in zip(rows, ref):
        assert [tok for _, tok, _ in got] == token_ids
        assert [lp for lp, _, _ in got] == pytest.approx(want[token_ids].tolist(), abs=2e-4)


def test_token_ids_logprob_on_prompt_and_output_match_hf() -> None:
    engine = _engine("qwen2_5_vl", 5)  # the prompt's rows come from several chunks
    engine.flush_cache()
    prompt = "The quick brown fox jumps over the lazy dog and"
    out = engine.generate(
        prompt,
        {"temperature": 0, "max_new_tokens": 4},
        return_logprob=True,
        top_logprobs_num=2,
        logprob_start_len=0,
        token_ids_logprob=TOKEN_IDS,
    )
    meta, output = out["meta_info"], out["output_ids"]
    prompt_ids = [tok for _, tok, _ in meta["input_token_logprobs"]]
    ref = _hf_logprobs("qwen2_5_vl", prompt_ids + output)
    n = len(prompt_ids)
    assert meta["input_token_ids_logprobs"][0] is None  # nothing predicts the first token
    _assert_token_ids_rows(meta["input_token_ids_logprobs"][1:], ref[: n - 1], TOKEN_IDS)
    _assert_token_ids_rows(meta["output_token_ids_logprobs"], ref[n - 1 : -1], TOKEN_IDS)
    assert len(meta["output_top_logprobs"]) == len(output)
    engine.scheduler.check_integrity()


def test_token_ids_logprob_per_prompt_and_refused_ids() -> None:
    engine = _engine("qwen2_5_vl", -1)
    prompts = ["Once upon a time", "The cat sat"]
    outs = engine.generate(prompts, ONE_TOKEN, return_logprob=True, token_ids_logprob=[[7], [9, 8]])
    for out, ids in zip(outs, [[7], [9, 8]]):
        meta = out["meta_info"]
        assert meta["input_token_ids_logprobs"] == []  # no prompt logprobs were asked
        assert [[tok for _, tok, _ in row] for row in meta["output_token_ids_logprobs"]] == [ids]
    plain = engine.generate(prompts[0], ONE_TOKEN, return_logprob=True)
    assert "output_token_ids_logprobs" not in plain["meta_info"]
    vocab = engine.runner.vocab_size
    for bad, match in [
        ([vocab], "outside the vocabulary"),
        ([-1], "outside the vocabulary"),
        (list(range(65)), "at most 64"),
    ]:
        with pytest.raises(ValueError, match=match):
            engine.generate(prompts[0], ONE_TOKEN, return_logprob=True, token_ids_logprob=bad)
    with pytest.raises(ValueError, match="2 prompts"):
        engine.generate(prompts, ONE_TOKEN, return_logprob=True, token_ids_logprob=[[1]])


@pytest.fixture(scope="module")
def server():
    with launch_server(model_dir("qwen2_5_vl"), "--chunked-prefill-size", "8") as (url, _):
        yield url


def test_generate_and_completions_echo_return_prompt_logprobs(server) -> None:
    prompt = "Once upon a time there was a"
    ids, ref, ref_top = _hf_prompt_logprobs("qwen2_5_vl", prompt, [])
    gen = httpx.post(
        f"{server}/generate",
        json={
            "text": prompt,
            "sampling_params": ONE_TOKEN,
            "return_logprob": True,
            "logprob_start_len": 2,
            "top_logprobs_num": 2,
        },
        timeout=60,
    ).json()
    _assert_prompt_logprobs(gen["meta_info"], ids, ref, 2)
    assert len(gen["meta_info"]["input_top_logprobs"]) == len(ids) - 2

    body = {"model": "m", "prompt": prompt, "max_tokens": 3, "temperature": 0, "echo": True}
    full = httpx.post(f"{server}/v1/completions", json={**body, "logprobs": 2}, timeout=60)
    choice = full.json()["choices"][0]
    logprobs = choice["logprobs"]
    n_out = full.json()["usage"]["completion_tokens"]
    assert len(logprobs["tokens"]) == len(ids) + n_out
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert logprobs["token_logprobs"][1 : len(ids)] == pytest.approx(ref[1:], abs=2e-4)
    assert choice["text"].startswith(prompt)
    assert logprobs["text_offset"][: len(ids)] == sorted(logprobs["text_offset"][: len(ids)])

    with httpx.stream(
        "POST", f"{server}/v1/completions", json={**body, "logprobs": 2, "stream": True}
    ) as resp:
        chunks = [line[6:] for line in resp.iter_lines() if line.startswith("data: {")]
    streamed = [json.loads(c)["choices"][0] for c in chunks]
    assert streamed[0]["text"] == prompt
    tokens = [t for c in streamed if c["logprobs"] for t in c["logprobs"]["tokens"]]
    assert tokens == logprobs["tokens"]
    assert "".join(c["text"] for c in streamed) == choice["text"]

    bad = httpx.post(
        f"{server}/generate",
        json={"text": prompt, "return_logprob": True, "logprob_start_len": -3},
        timeout=60,
    )
    assert bad.status_code == 400


def test_generate_token_ids_logprob_over_http(server) -> None:
    prompt = "Once upon a time there was a"
    body = {
        "text": prompt,
        "sampling_params": {"temperature": 0, "max_new_tokens": 3},
        "return_logprob": True,
        "logprob_start_len": 2,
        "token_ids_logprob": TOKEN_IDS,
        "return_text_in_logprobs": True,
    }
    out = httpx.post(f"{server}/generate", json=body, timeout=60).json()
    meta = out["meta_info"]
    prompt_ids = [tok for _, tok, _ in meta["input_token_logprobs"]]
    ids, _, _ = _hf_prompt_logprobs("qwen2_5_vl", prompt, [])
    assert prompt_ids == ids[2:]
    ref = _hf_logprobs("qwen2_5_vl", ids + out["output_ids"])
    _assert_token_ids_rows(meta["input_token_ids_logprobs"], ref[1 : len(ids) - 1], TOKEN_IDS)
    _assert_token_ids_rows(meta["output_token_ids_logprobs"], ref[len(ids) - 1 : -1], TOKEN_IDS)
    _, processor = _hf("qwen2_5_vl")
    tokenizer = getattr(processor, "tokenizer", processor)
    texts = [text for _, _, text in meta["output_token_ids_logprobs"][0]]
    assert texts == [tokenizer.decode([t]) for t in TOKEN_IDS]
    with httpx.stream("POST", f"{server}/generate", json={**body, "stream": True}) as resp:
        chunks = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    last = chunks[-1]["meta_info"]
    ref_rows = ref[len(ids) - 1 : len(ids) - 1 + len(last["output_token_ids_logprobs"])]
    _assert_token_ids_rows(last["output_token_ids_logprobs"], ref_rows, TOKEN_IDS)
    assert len(ref_rows) == len(out["output_ids"])  # greedy: the same tokens again
    for bad in ([10**6], list(range(65))):
        resp = httpx.post(f"{server}/generate", json={**body, "token_ids_logprob": bad}, timeout=60)
        assert resp.status_code == 400, resp.text
        assert "token_ids_logprob" in resp.text
