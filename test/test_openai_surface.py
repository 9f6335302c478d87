"""End-to-end OpenAI surface on the real server: structured outputs (the openai client's
``parse`` with a pydantic model), tools with ``--tool-call-parser qwen25``, logprobs, n, seed,
logit_bias and stop strings; streaming and non-streaming agree."""

from __future__ import annotations

import base64
import concurrent.futures
import io
import json
import re
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
import transformers
from conftest import make_image, model_dir, placeholder
from pydantic import BaseModel, ConfigDict, Field
from server_utils import launch_server

MODEL = "tiny-vl"


@pytest.fixture(scope="module")
def server():
    flags = ["--tool-call-parser", "qwen25", "--enable-cache-report", "--chunked-prefill-size"]
    flags += ["32", "--served-model-name", MODEL, "--random-seed", "0"]
    flags += ["--constrained-json-disable-any-whitespace"]  # compact JSON: shorter outputs
    with launch_server(model_dir("qwen2_5_vl"), *flags) as (url, _):
        yield url


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused")


def _image_url(seed: int) -> str:
    buf = io.BytesIO()
    make_image(seed).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _ask(text: str, image_seed: int | None = None) -> list[dict]:
    parts: list[dict] = [{"type": "text", "text": text}]
    if image_seed is not None:
        parts.insert(0, {"type": "image_url", "image_url": {"url": _image_url(image_seed)}})
    return [{"role": "user", "content": parts}]


def _stream_text(stream) -> tuple[str, list, str | None]:
    text, logprobs, finish = "", [], None
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.logprobs and choice.logprobs.content:
                logprobs += choice.logprobs.content
            finish = choice.finish_reason or finish
    return text, logprobs, finish


class Receipt(BaseModel):
    model_config = ConfigDict(extra="forbid")
    shop: str = Field(max_length=8)
    total: int = Field(ge=0, le=999)
    paid: bool
    kind: Literal["food", "fuel", "other"]


def test_parse_with_a_pydantic_model(client) -> None:
    parse = getattr(getattr(client, "beta", client).chat.completions, "parse", None)
    parse = parse or client.chat.completions.parse
    completion = parse(
        model=MODEL,
        messages=_ask("Read this receipt.", image_seed=1),
        response_format=Receipt,
        max_tokens=200,
        temperature=0,
    )
    message = completion.choices[0].message
    assert isinstance(message.parsed, Receipt), message.content
    assert Receipt.model_validate_json(message.content) == message.parsed


def test_json_schema_stream_agrees_and_validates(client) -> None:
    schema = {
        "type": "object",
        "properties": {
            "labels": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 3},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["labels", "score"],
        "additionalProperties": False,
    }
    kwargs = dict(
        model=MODEL,
        messages=_ask("Label the image.", image_seed=2),
        max_tokens=200,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "labels", "schema": schema, "strict": True},
        },
    )
    full = client.chat.completions.create(**kwargs)
    text, _, finish = _stream_text(client.chat.completions.create(**kwargs, stream=True))
    assert text == full.choices[0].message.content and finish == "stop"
    jsonschema.validate(json.loads(text), schema)
    obj = client.chat.completions.create(
        **{**kwargs, "response_format": {"type": "json_object"}, "max_tokens": 24}
    )
    obj_stream, _, _ = _stream_text(
        client.chat.completions.create(
            **{**kwargs, "response_format": {"type": "json_object"}, "max_tokens": 24}, stream=True
        )
    )
    assert obj_stream == obj.choices[0].message.content and obj_stream.startswith("{")


@pytest.mark.parametrize(
    "body, needle",
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 3}}}},
            "invalid json_schema",
        ),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "schema"),
        ({"regex": "(unclosed"}, "invalid regex"),
        ({"logit_bias": {"99999999": 1}}, "outside the vocabulary"),
        ({"tool_choice": "required"}, "tool_choice needs tools"),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"type": "function", "function": {"name": "g"}},
            },
            "not in tools",
        ),
        ({"logprobs": True, "top_logprobs": 50}, "top_logprobs"),
    ],
)
def test_bad_structured_requests_are_400(server, body, needle) -> None:
    payload = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body}
    resp = httpx.post(f"{server}/v1/chat/completions", json=payload, timeout=60)
    assert resp.status_code == 400, resp.text
    assert needle in resp.json()["error"]["message"], resp.text
    assert httpx.get(f"{server}/health_generate", timeout=60).status_code == 200


def test_chat_logprobs_stream_agrees(client) -> None:
    kwargs = dict(model=MODEL, messages=_ask("Count"), max_tokens=6, temperature=0)
    full = client.chat.completions.create(**kwargs, logprobs=True, top_logprobs=2)
    entries = full.choices[0].logprobs.content
    assert "".join(e.token for e in entries) == full.choices[0].message.content
    for e in entries:
        assert len(e.top_logprobs) == 2 and e.top_logprobs[0].token == e.token
        assert e.bytes == list(e.token.encode()) and e.logprob <= 0
    text, streamed, _ = _stream_text(
        client.chat.completions.create(**kwargs, logprobs=True, top_logprobs=2, stream=True)
    )
    assert text == full.choices[0].message.content
    assert [e.token for e in streamed] == [e.token for e in entries]
    # The second run reads the prompt's KV from the radix cache: same values up to rounding.
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in entries], abs=1e-4)
    plain = client.chat.completions.create(**kwargs)
    assert plain.choices[0].logprobs is None


def test_completion_logprobs_and_echo(client) -> None:
    full = client.completions.create(
        model=MODEL, prompt="Once upon", max_tokens=5, temperature=0, logprobs=3
    )
    lp = full.choices[0].logprobs
    assert "".join(lp.tokens) == full.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    for top, token, logprob in zip(lp.top_logprobs, lp.tokens, lp.token_logprobs):
        assert len(top) == 3 and top[token] == logprob
    chunks = list(
        client.completions.create(
            model=MODEL, prompt="Once upon", max_tokens=5, temperature=0, logprobs=3, stream=True
        )
    )
    tokens = [
        t for c in chunks for t in (c.choices[0].logprobs.tokens if c.choices[0].logprobs else [])
    ]
    assert (
        tokens == lp.tokens and "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    )
    echo = client.completions.create(
        model=MODEL, prompt="Once upon", max_tokens=5, temperature=0, echo=True
    )
    assert echo.choices[0].text == "Once upon" + full.choices[0].text


def test_logprob_entries_include_what_the_text_skips(client) -> None:
    """``<|im_start|>`` is an added special token that the text's decode skips although the
    tokenizer's ``all_special_ids`` does not name it; as in SGLang, its logprob entries stay."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir("qwen2_5_vl"))
    marker = "<|im_start|>"
    kwargs = dict(model=MODEL, max_tokens=3, temperature=0, logprobs=1)
    bias = {"logit_bias": {str(tokenizer.convert_tokens_to_ids(marker)): 100}}
    done = client.completions.create(prompt="Once upon", extra_body=bias, **kwargs)
    assert done.choices[0].text == "" and done.choices[0].logprobs.tokens == [marker] * 3
    kept = client.completions.create(
        prompt="Once upon", extra_body={**bias, "skip_special_tokens": False}, **kwargs
    )
    assert kept.choices[0].logprobs.tokens == [marker] * 3
    assert "".join(kept.choices[0].logprobs.tokens) == kept.choices[0].text
    chat = client.chat.completions.create(
        model=MODEL,
        messages=_ask("Count"),
        max_tokens=3,
        temperature=0,
        logprobs=True,
        extra_body=bias,
    )
    assert chat.choices[0].message.content == ""
    assert [e.token for e in chat.choices[0].logprobs.content] == [marker] * 3


def test_n_choices_share_one_image_encode(client, server) -> None:
    def encoded() -> int:
        return httpx.get(f"{server}/server_info").json()["mm_embedding_cache"]["encoded_items"]

    before = encoded()
    kwargs = dict(model=MODEL, messages=_ask("Describe", 30), max_tokens=5, temperature=1.0, seed=4)
    full = client.chat.completions.create(**kwargs, n=3)
    assert encoded() - before == 1
    assert [c.index for c in full.choices] == [0, 1, 2]
    assert len({c.message.content for c in full.choices}) > 1
    single = client.chat.completions.create(**kwargs)
    assert full.usage.prompt_tokens == single.usage.prompt_tokens
    assert 3 <= full.usage.completion_tokens <= 15  # summed over the choices
    again = client.chat.completions.create(**kwargs, n=3)
    assert [c.message.content for c in again.choices] == [c.message.content for c in full.choices]
    streamed: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for chunk in client.chat.completions.create(**kwargs, n=3, stream=True):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert streamed == {c.index: c.message.content for c in full.choices}
    assert set(finishes) == {0, 1, 2}
    assert encoded() - before == 1


def test_seed_reproducible_among_concurrent_requests(server) -> None:
    seeded = {
        "messages": [{"role": "user", "content": "Tell me a story"}],
        "max_tokens": 8,
        "temperature": 1.0,
        "seed": 123,
    }
    noise = {"messages": _ask("noise", 40), "max_tokens": 12, "temperature": 0.9}

    def post(body: dict) -> str:
        resp = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=120)
        assert resp.status_code == 200, resp.text
        return resp.json()["choices"][0]["message"]["content"]

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(post, [seeded, noise, seeded, noise, seeded, noise]))
    assert results[0] == results[2] == results[4]
    other_seed = post({**seeded, "seed": 124})
    assert other_seed != results[0]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 12},
                    "unit": {"enum": ["C", "F"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    }
]


def test_tool_calls_required_named_auto_and_history(client) -> None:
    messages = _ask("What is the weather in Paris?", image_seed=5)
    kwargs = dict(model=MODEL, messages=messages, tools=TOOLS, max_tokens=120, temperature=0)
    required = client.chat.completions.create(
        **kwargs, tool_choice="required", parallel_tool_calls=False
    )
    choice = required.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    schema = TOOLS[0]["function"]["parameters"]
    for call in choice.message.tool_calls:
        assert call.function.name == "get_weather" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), schema)
    named_choice = {"type": "function", "function": {"name": "get_weather"}}
    named = client.chat.completions.create(**kwargs, tool_choice=named_choice)
    calls = named.choices[0].message.tool_calls
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    streamed = {}
    finish = None
    for chunk in client.chat.completions.create(**kwargs, tool_choice=named_choice, stream=True):
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                entry = streamed.setdefault(d.index, {"name": "", "arguments": ""})
                entry["name"] += d.function.name or ""
                entry["arguments"] += d.function.arguments or ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    assert streamed == {0: {"name": "get_weather", "arguments": calls[0].function.arguments}}
    auto = client.chat.completions.create(**{**kwargs, "max_tokens": 8})
    choice = auto.choices[0]  # tool_choice auto: the finish reason follows what was generated
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
    elif auto.usage.completion_tokens == 8:
        assert choice.finish_reason == "length"
    else:
        assert choice.finish_reason == "stop" and auto.usage.completion_tokens < 8
    history = messages + [
        {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": [{"type": "text", "text": "21"}]},
    ]
    follow_up = client.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, max_tokens=4, temperature=0
    )
    assert follow_up.usage.prompt_tokens > auto.usage.prompt_tokens


def test_logit_bias_and_stop_string_kept(client) -> None:
    base = dict(model=MODEL, prompt="The quick brown", max_tokens=6, temperature=0)
    forced = client.completions.create(**base, logit_bias={"300": 100}, logprobs=0)
    assert len(forced.choices[0].logprobs.tokens) == 6
    assert len(set(forced.choices[0].logprobs.tokens)) == 1
    free = client.completions.create(**{**base, "max_tokens": 12}).choices[0].text
    stop = next(free[i : i + 2] for i in range(2, len(free) - 1) if free[i : i + 2].strip())
    cut = client.completions.create(**{**base, "max_tokens": 12}, stop=[stop])
    kept = client.completions.create(
        **{**base, "max_tokens": 12}, stop=[stop], extra_body={"include_stop_str_in_output": True}
    )
    assert kept.choices[0].text == cut.choices[0].text + stop
    assert free.startswith(kept.choices[0].text)


def test_generate_regex_n_and_top_logprobs(server) -> None:
    ph = placeholder("qwen2_5_vl")
    image = base64.b64encode(_png(50)).decode()
    body = {
        "text": f"Code for {ph}:",
        "image_data": image,
        "sampling_params": {"regex": "[A-Z]{2}-[0-9]{3}", "n": 2, "temperature": 1.0, "seed": 9},
        "return_logprob": True,
        "top_logprobs_num": 2,
    }
    outs = httpx.post(f"{server}/generate", json=body, timeout=120).json()
    assert isinstance(outs, list) and len(outs) == 2
    for out in outs:
        assert re.fullmatch("[A-Z]{2}-[0-9]{3}", out["text"]), out["text"]
        tops = out["meta_info"]["output_top_logprobs"]
        assert len(tops) == len(out["output_ids"]) and all(len(t) == 2 for t in tops)
    events = []
    with httpx.stream(
        "POST", f"{server}/generate", json={**body, "stream": True}, timeout=120
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    finals = {e["index"]: e["text"] for e in events if e["meta_info"]["finish_reason"]}
    assert finals == {0: outs[0]["text"], 1: outs[1]["text"]}


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    make_image(seed).save(buf, format="PNG")
    return buf.getvalue()
