"""SGLang's own behaviour where clients and its test kits read it: ``reasoning_content`` in
every chat delta, logprobs of the logits a token was drawn from, ``matched_stop``, the context
checks in SGLang's words, streams whose every chunk carries its tokens' logprobs, the
tokenize / detokenize / models endpoints (abort and pause:
``test_sglang_control.py``), ``continue_final_message``, ``cache_salt``,
custom logit processors and the metrics SGLang names."""

from __future__ import annotations

import json
import math

import httpx
import openai
import pytest
from conftest import model_dir
from server_utils import launch_server

from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

MODEL = "tiny-vl"
CONTEXT = 256


@pytest.fixture(scope="module")
def server():
    flags = ["--served-model-name", MODEL, "--context-length", str(CONTEXT), "--enable-metrics"]
    flags += ["--enable-custom-logit-processor", "--enable-cache-report"]
    with launch_server(model_dir("qwen2_5_vl"), *flags) as (url, _):
        yield url


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="EMPTY")


def _sse(url: str, body: dict) -> list[dict]:
    with httpx.stream("POST", url, json=body, timeout=120) as resp:
        assert resp.status_code == 200, resp.read()
        lines = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def _generate(server: str, **body) -> dict:
    resp = httpx.post(f"{server}/generate", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _logsumexp(values: list[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


# Chat deltas ---------------------------------------------------------------------------------
def test_every_chat_delta_carries_reasoning_content(server, client) -> None:
    messages = [{"role": "user", "content": "Hello there"}]
    chunks = _sse(
        f"{server}/v1/chat/completions",
        {"messages": messages, "max_tokens": 6, "temperature": 0, "stream": True},
    )
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert len(deltas) >= 3  # role, content, finish
    for delta in deltas:
        assert {"role", "content", "reasoning_content"} <= set(delta)
        assert delta["reasoning_content"] is None and "tool_calls" not in delta
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=6, temperature=0, stream=True
    )
    assert all(c.choices[0].delta.reasoning_content is None for c in stream if c.choices)
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6)
    assert whole.choices[0].message.reasoning_content is None


# Logprobs ------------------------------------------------------------------------------------
def test_logprobs_are_those_of_the_grammar_masked_logits(server) -> None:
    """The constrained token's logprob is its unconstrained one renormalised over the tokens the
    grammar allows (read from an unconstrained request), and no forbidden token is reported as
    a likely alternative."""
    regex, prompt = "( Yes| No)", "Is the sky blue? Answer:"
    constrained = _generate(
        server,
        text=prompt,
        sampling_params={"regex": regex, "temperature": 0, "max_new_tokens": 1},
        return_logprob=True,
        top_logprobs_num=20,
    )["meta_info"]
    chosen_lp, chosen, _ = constrained["output_token_logprobs"][0]
    tops = constrained["output_top_logprobs"][0]
    allowed = [tok for lp, tok, _ in tops if lp > -1e30]
    assert chosen in allowed and len(allowed) < len(tops)  # every allowed token was listed
    assert all(lp <= -1e30 for lp, tok, _ in tops if tok not in allowed)
    free = _generate(
        server,
        text=prompt,
        sampling_params={"temperature": 0, "max_new_tokens": 1},
        return_logprob=True,
        token_ids_logprob=allowed,
    )["meta_info"]["output_token_ids_logprobs"][0]
    raw = {tok: lp for lp, tok, _ in free}
    expected = raw[chosen] - _logsumexp([raw[t] for t in allowed])
    assert chosen_lp == pytest.approx(expected, abs=1e-4)
    assert math.exp(chosen_lp) > math.exp(raw[chosen])  # the mask moved the mass


def test_a_token_forced_by_logit_bias_is_reported_as_certain(server) -> None:
    meta = _generate(
        server,
        text="The quick brown",
        sampling_params={"logit_bias": {"100": 100}, "temperature": 0, "max_new_tokens": 3},
        return_logprob=True,
    )["meta_info"]
    assert [tok for _, tok, _ in meta["output_token_logprobs"]] == [100, 100, 100]
    assert all(lp > -1e-3 for lp, _, _ in meta["output_token_logprobs"])


def test_sampled_logprobs_follow_the_temperature(server) -> None:
    """As SGLang's sampler: a sampled row's logprobs are those of logits / temperature."""
    body = {"text": "Once upon", "return_logprob": True, "token_ids_logprob": [100, 200]}
    greedy = _generate(server, **body, sampling_params={"temperature": 0, "max_new_tokens": 1})
    hot = _generate(
        server, **body, sampling_params={"temperature": 2.0, "max_new_tokens": 1, "seed": 1}
    )
    cold = {t: lp for lp, t, _ in greedy["meta_info"]["output_token_ids_logprobs"][0]}
    warm = {t: lp for lp, t, _ in hot["meta_info"]["output_token_ids_logprobs"][0]}
    assert warm[100] - warm[200] == pytest.approx((cold[100] - cold[200]) / 2, abs=1e-4)


def test_every_completion_stream_chunk_carries_its_tokens_logprobs(client) -> None:
    """SGLang's test_completion_stream: two prompts streamed with logprobs=5; each chunk has
    the logprobs of the tokens it brings (a lagging reader once got a chunk without any)."""
    for _ in range(6):
        stream = client.completions.create(
            model=MODEL,
            prompt=["The capital of France is"] * 2,
            temperature=0,
            max_tokens=32,
            logprobs=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            if chunk.usage is not None:
                continue
            choice = chunk.choices[0]
            assert choice.logprobs and isinstance(choice.logprobs.tokens[0], str), chunk
            assert len(choice.logprobs.top_logprobs[0]) > 0


def test_logprobs_include_the_eos_that_ended_the_choice(server, client) -> None:
    """As SGLang: every output token has an entry, the EOS that ended the choice (forced here by
    logit_bias) included, whole and in the stream's finish chunk."""
    tokens = httpx.post(f"{server}/tokenize", json={"prompt": "<|im_end|>"}, timeout=30)
    tokenizer_eos = tokens.json()["tokens"][0]
    bias = {"logit_bias": {str(tokenizer_eos): 100.0}}
    whole = client.completions.create(
        model=MODEL, prompt="Hi", max_tokens=4, logprobs=1, extra_body=bias
    ).choices[0]
    assert whole.finish_reason == "stop" and whole.model_extra["matched_stop"] == tokenizer_eos
    assert whole.text == "" and whole.logprobs.tokens == ["<|im_end|>"]
    assert whole.logprobs.token_logprobs[0] > -1e-3  # forced: all but certain
    chunks = _sse(
        f"{server}/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "logprobs": True,
         "stream": True, **bias},
    )  # fmt: skip
    entries = [e for c in chunks if c["choices"] for e in (c["choices"][0]["logprobs"] or {
        "content": []})["content"]]  # fmt: skip
    assert [e["token"] for e in entries] == ["<|im_end|>"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


# Stops and lengths ---------------------------------------------------------------------------
def test_matched_stop_names_what_ended_the_choice(server, client) -> None:
    base = dict(model=MODEL, prompt="The quick brown", temperature=0)
    free = client.completions.create(**base, max_tokens=12).choices[0]
    assert free.finish_reason == "length" and free.model_extra["matched_stop"] is None
    stop = next(free.text[i : i + 2] for i in range(2, 10) if free.text[i : i + 2].strip())
    cut = client.completions.create(**base, max_tokens=12, stop=[stop]).choices[0]
    assert cut.finish_reason == "stop" and cut.model_extra["matched_stop"] == stop
    first_id = _generate(server, text="The quick brown", sampling_params={"max_new_tokens": 1})
    token = first_id["output_ids"][0]
    by_id = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=8,
        temperature=0,
        extra_body={"stop_token_ids": [token]},
    )
    reason = by_id.choices[0].model_extra["matched_stop"]
    assert (reason == token) == (by_id.choices[0].finish_reason == "stop")
    chunks = _sse(
        f"{server}/v1/completions",
        {"prompt": "The quick brown", "max_tokens": 12, "temperature": 0, "stop": [stop],
         "stream": True},
    )  # fmt: skip
    finals = [c["choices"][0] for c in chunks if c["choices"][0]["finish_reason"]]
    assert [f["matched_stop"] for f in finals] == [stop]


def test_context_checks_answer_in_sglangs_words(client) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="Hello", max_tokens=CONTEXT)
    message = str(info.value)
    assert "Requested token count exceeds the model's maximum context length of 256" in message
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="word " * (2 * CONTEXT), max_tokens=4)
    assert "is longer than the model's context length (256 tokens)" in str(info.value)
    # without max_tokens a chat may run to the context's end: no error
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], temperature=0
    )
    assert reply.usage.prompt_tokens + reply.usage.completion_tokens <= CONTEXT


# Endpoints -----------------------------------------------------------------------------------
def test_models_retrieve_tokenize_and_detokenize(server, client) -> None:
    card = client.models.retrieve(MODEL)
    assert card.id == MODEL and card.model_extra["max_model_len"] == CONTEXT
    missing = httpx.get(f"{server}/v1/models/other", timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    tokenizer = __import__("transformers").AutoTokenizer.from_pretrained(model_dir("qwen2_5_vl"))
    for path in ("/v1/tokenize", "/tokenize"):
        out = httpx.post(f"{server}{path}", json={"prompt": "hello world"}, timeout=30).json()
        assert out["tokens"] == tokenizer.encode("hello world") and out["count"] == len(
            out["tokens"]
        )
    batch = httpx.post(f"{server}/v1/tokenize", json={"prompt": ["a b", "c"]}, timeout=30).json()
    assert batch["count"] == [len(ids) for ids in batch["tokens"]]
    messages = [{"role": "user", "content": "Hi"}]
    chat = httpx.post(f"{server}/v1/tokenize", json={"messages": messages}, timeout=30).json()
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    assert chat["count"] == reply.usage.prompt_tokens
    text = httpx.post(f"{server}/v1/detokenize", json={"tokens": batch["tokens"]}, timeout=30)
    assert text.json() == {"text": ["a b", "c"]}
    bad = httpx.post(f"{server}/detokenize", json={"tokens": [10**9]}, timeout=30)
    assert bad.status_code == 400 and "outside the vocabulary" in bad.text
    neither = httpx.post(f"{server}/v1/tokenize", json={}, timeout=30)
    assert neither.status_code == 400


def test_continue_final_message_continues_the_assistant_text(server, client) -> None:
    prefix = "The answer is"
    messages = [{"role": "user", "content": "Tell me"}, {"role": "assistant", "content": prefix}]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=6,
        temperature=0,
        extra_body={"continue_final_message": True},
    )
    opened = client.chat.completions.create(
        model=MODEL, messages=messages[:1], max_tokens=1, temperature=0
    )
    tokenizer = __import__("transformers").AutoTokenizer.from_pretrained(model_dir("qwen2_5_vl"))
    assert reply.usage.prompt_tokens == opened.usage.prompt_tokens + len(
        tokenizer.encode(prefix, add_special_tokens=False)
    )
    prompt = tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    raw = _generate(
        server, text=prompt + prefix, sampling_params={"max_new_tokens": 6, "temperature": 0}
    )
    assert reply.choices[0].message.content == raw["text"]


def test_cache_salt_separates_prefix_caches(server) -> None:
    text = "A long shared prefix that the radix cache keeps for the next request: " * 3

    def cached(salt: str | None) -> int:
        body = {"text": text, "sampling_params": {"max_new_tokens": 1}}
        if salt is not None:
            body["cache_salt"] = salt
        return _generate(server, **body)["meta_info"]["cached_tokens"]

    assert httpx.post(f"{server}/flush_cache", timeout=30).status_code == 200
    cached("alice")
    assert cached("alice") > 0
    assert cached("bob") == 0
    assert cached(None) == 0
    assert cached(None) > 0


def _processors() -> tuple[str, str]:
    """Two processors as clients send them (defined here: dill pickles a class of an importable
    module by reference, which the server cannot import, and a local one by value)."""

    class ForceToken(CustomLogitProcessor):
        def __call__(self, logits, custom_param_list=None):
            for row, params in enumerate(custom_param_list):
                logits[row, :] = float("-inf")
                logits[row, params["token_id"]] = 0.0
            return logits

    class Raises(CustomLogitProcessor):
        def __call__(self, logits, custom_param_list=None):
            raise RuntimeError("no")

    return ForceToken.to_str(), Raises.to_str()


def test_custom_logit_processors_run_per_request(server) -> None:
    force, raises = _processors()
    forced = _generate(
        server,
        text="Hi",
        custom_logit_processor=force,
        sampling_params={"max_new_tokens": 3, "custom_params": {"token_id": 77}},
    )
    assert forced["output_ids"] == [77, 77, 77]
    failing = httpx.post(
        f"{server}/generate",
        json={"text": "Hi", "custom_logit_processor": raises},
        timeout=60,
    )
    assert failing.status_code == 500 and "custom_logit_processor failed: no" in failing.text
    garbage = httpx.post(
        f"{server}/generate", json={"text": "Hi", "custom_logit_processor": "x"}, timeout=60
    )
    assert garbage.status_code == 400
    plain = _generate(server, text="Hi", sampling_params={"max_new_tokens": 3, "temperature": 0})
    assert plain["output_ids"] != [77, 77, 77]  # the server still samples as before


def test_custom_logit_processors_are_refused_unless_enabled() -> None:
    with launch_server(model_dir("qwen2_5_vl"), "--context-length", "256") as (url, _):
        resp = httpx.post(
            f"{url}/generate",
            json={"text": "Hi", "custom_logit_processor": _processors()[0]},
            timeout=60,
        )
    assert resp.status_code == 400 and "--enable-custom-logit-processor" in resp.text


def test_metrics_carry_sglangs_names_and_model_label(server) -> None:
    _generate(server, text="Hi", sampling_params={"max_new_tokens": 4})
    lines = httpx.get(f"{server}/metrics", timeout=30).text.splitlines()
    samples = [line for line in lines if line and not line.startswith("#")]
    assert samples and all(f'model_name="{MODEL}"' in line for line in samples)
    values = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in samples}
    for name in ("num_used_tokens", "gen_throughput", "num_grammar_queue_reqs"):
        assert f"sglang:{name}" in values, name
    assert values["sglang:gen_throughput"] > 0
    info = httpx.get(f"{server}/server_info", timeout=30).json()  # idle: the same KV held
    assert info["num_used_tokens"] == values["sglang:num_used_tokens"] > 0
    used = values["sglang:num_used_tokens"] / info["max_total_num_tokens"]
    assert values["sglang:token_usage"] == pytest.approx(used)


def test_an_events_logprobs_do_not_grow_with_later_outputs() -> None:
    """A stream reader that lags behind reads each event's logprobs as they were then."""
    from types import SimpleNamespace

    from sglang.srt.core.io_struct import logprob_meta

    request = SimpleNamespace(top_logprobs_num=1, token_ids_logprob=None)
    output = {"output_token_logprobs": [(-1.0, 5, None)], "output_top_logprobs": [[(-1.0, 5)]]}
    meta = logprob_meta(request, output, {})
    output["output_token_logprobs"].append((-2.0, 6, None))
    output["output_top_logprobs"].append([(-2.0, 6)])
    assert meta["output_token_logprobs"] == [(-1.0, 5, None)]
    assert len(meta["output_top_logprobs"]) == meta["output_token_logprobs_length"] == 1


def test_responses_api_whole_streamed_and_chained(server, client) -> None:
    """``/v1/responses`` answers as the chat completion of the same messages would; its stream
    spells the same text in OpenAI's event order; ``previous_response_id`` carries the
    conversation, its answer included."""
    first = client.responses.create(model=MODEL, input="Hello", max_output_tokens=8, temperature=0)
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=8, temperature=0
    )
    assert first.output_text == chat.choices[0].message.content
    assert first.usage.input_tokens == chat.usage.prompt_tokens
    assert first.status == (
        "incomplete" if chat.choices[0].finish_reason == "length" else "completed"
    )
    events = list(
        client.responses.create(
            model=MODEL, input="Hello", max_output_tokens=8, temperature=0, stream=True
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-1] == "response.completed" and kinds[-2] == "response.output_item.done"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == first.output_text == events[-1].response.output_text
    follow = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "And?"}]}],
        max_output_tokens=4,
        temperature=0,
    )
    history = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And?"},
    ]
    again = client.chat.completions.create(
        model=MODEL, messages=history, max_tokens=4, temperature=0
    )
    assert follow.output_text == again.choices[0].message.content
    assert client.responses.retrieve(first.id).output_text == first.output_text
    with pytest.raises(openai.BadRequestError, match="unknown"):
        client.responses.create(model=MODEL, input="Hi", previous_response_id="resp_none")
