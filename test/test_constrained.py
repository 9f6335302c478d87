"""Constrained decoding on the offline engine with a random-weight model: whatever the weights,
outputs match their JSON schema / regex / EBNF grammar; unconstrained neighbours are untouched;
logit_bias, top logprobs, n > 1 and stop handling."""

from __future__ import annotations

import ast
import json
import re
import time

import jsonschema
import pytest
import torch
from conftest import examples, hf_greedy, make_image, model_dir, placeholder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sglang
from sglang.srt.function_call import qwen25

FAMILY = "qwen2_5_vl"
PH = placeholder(FAMILY)


@pytest.fixture(scope="module")
def engine() -> sglang.Engine:
    return sglang.Engine(
        dtype="float32", model_path=model_dir(FAMILY), chunked_prefill_size=32, random_seed=0
    )


# JSON schemas --------------------------------------------------------------------------------
# Every generated schema bounds its output (string lengths, array sizes, number ranges) so that
# a random model, which never "wants" to close a string, still finishes.
_names = st.sampled_from(["id", "name", "tags", "size", "ok", "kind", "items", "note"])
_leaves = st.one_of(
    st.builds(
        lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
        st.integers(-50, 50),
        st.integers(0, 500),
    ),
    st.builds(
        lambda lo, span: {"type": "number", "minimum": lo, "maximum": lo + span},
        st.integers(-5, 5),
        st.integers(1, 10),
    ),
    st.builds(
        lambda lo, extra: {"type": "string", "minLength": lo, "maxLength": lo + extra},
        st.integers(0, 2),
        st.integers(0, 5),
    ),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(
        lambda values: {"enum": values},
        st.lists(
            st.one_of(st.sampled_from(["red", "green", "blue"]), st.integers(0, 9)),
            min_size=1,
            max_size=3,
            unique=True,
        ),
    ),
)


def _containers(children: st.SearchStrategy) -> st.SearchStrategy:
    objects = st.dictionaries(_names, children, min_size=1, max_size=3).flatmap(
        lambda props: st.builds(
            lambda required: {
                "type": "object",
                "properties": props,
                "required": sorted(required),
                "additionalProperties": False,
            },
            st.sets(st.sampled_from(sorted(props))),
        )
    )
    arrays = st.builds(
        lambda items, lo, extra: {
            "type": "array",
            "items": items,
            "minItems": lo,
            "maxItems": lo + extra,
        },
        children,
        st.integers(0, 1),
        st.integers(0, 2),
    )
    return st.one_of(objects, arrays)


json_schemas = st.recursive(_leaves, _containers, max_leaves=5)


@settings(
    max_examples=examples(15),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    schemas=st.lists(json_schemas, min_size=3, max_size=3),
    temperature=st.sampled_from([0.0, 1.0]),
    seed=st.integers(0, 1000),
)
def test_json_schema_outputs_validate(engine, schemas, temperature, seed) -> None:
    params = [
        {"json_schema": json.dumps(s), "max_new_tokens": 400, "temperature": temperature}
        | ({"seed": seed + i} if temperature else {})
        for i, s in enumerate(schemas)
    ]
    outs = engine.generate(["Answer in JSON:"] * len(schemas), params)
    for schema, out in zip(schemas, outs):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", (schema, out["text"])
        jsonschema.validate(json.loads(out["text"]), schema)


@pytest.mark.parametrize(
    "pattern",
    [
        r"\d{3}-\d{4}",
        r"(cat|dog|bird)s? (and|or) (cat|dog|bird)s?",
        r"[A-Z][a-z]{1,6}( [A-Z][a-z]{1,6}){0,2}\.",
        r"[a-z]{2,5}@[a-z]{2,5}\.(com|org)",
    ],
)
def test_regex_outputs_fullmatch(engine, pattern: str) -> None:
    params = [
        {"regex": pattern, "max_new_tokens": 64, "temperature": 1.0, "seed": s} for s in (1, 2)
    ]
    params.append({"regex": pattern, "max_new_tokens": 64, "temperature": 0})
    for out in engine.generate(["Write it:"] * 3, params):
        assert out["meta_info"]["finish_reason"]["type"] == "stop"
        assert re.fullmatch(pattern, out["text"]), out["text"]


ARITHMETIC = r"""
root ::= expr
expr ::= term ((" + " | " * ") term){0,3}
term ::= num | "(" num ((" + " | " - ") num){0,2} ")"
num ::= [1-9] [0-9]{0,2}
"""


def test_ebnf_outputs_parse(engine) -> None:
    params = [
        {"ebnf": ARITHMETIC, "max_new_tokens": 80, "temperature": 1.0, "seed": s} for s in range(4)
    ]
    for out in engine.generate(["Compute:"] * 4, params):
        assert out["meta_info"]["finish_reason"]["type"] == "stop"
        tree = ast.parse(out["text"], mode="eval")  # a Python expression: it parses as one
        assert all(isinstance(n, (ast.Expression, ast.BinOp, ast.Constant, ast.operator))
                   for n in ast.walk(tree)), out["text"]  # fmt: skip
        eval(compile(tree, "<grammar>", "eval"))  # only numbers and + - *: safe to evaluate


def test_constrained_request_leaves_batch_neighbours_unchanged(engine) -> None:
    prompts = ["The quick brown fox", f"Look {PH} here", "Once upon a time"]
    images = [None, make_image(3), None]
    greedy = {"temperature": 0, "max_new_tokens": 8}
    alone = [engine.generate(p, greedy, image_data=img) for p, img in zip(prompts, images)]
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
    }
    constrained = {"json_schema": json.dumps(schema), "temperature": 0, "max_new_tokens": 32}
    batch = engine.generate(
        [prompts[0], "JSON please", prompts[1], prompts[2]],
        [greedy, constrained, greedy, greedy],
        image_data=[None, None, images[1], None],
    )
    neighbours = [batch[0], batch[2], batch[3]]
    assert [o["output_ids"] for o in neighbours] == [o["output_ids"] for o in alone]
    assert alone[0]["output_ids"] == hf_greedy(FAMILY, prompts[0], [], 8)[0]
    jsonschema.validate(json.loads(batch[1]["text"]), schema)


def test_grammars_are_cached_by_schema(engine) -> None:
    backend = engine.scheduler.constraints.backend
    params = {"regex": "(yes|no) [0-9]", "max_new_tokens": 8, "temperature": 0}
    first = engine.generate("cache", params)
    compiles, hits = backend.compiles, backend.cache_hits
    second = engine.generate("cache", params)
    assert (backend.compiles, backend.cache_hits) == (compiles, hits + 1)
    assert first["output_ids"] == second["output_ids"]


def test_compiling_grammar_does_not_hold_up_other_requests(engine, monkeypatch) -> None:
    backend = engine.scheduler.constraints.backend
    original = backend._compile_now

    def slow(spec):
        time.sleep(1.0)
        return original(spec)

    monkeypatch.setattr(backend, "_compile_now", slow)
    tokenized, _ = engine.tokenize(
        ["slow grammar", "free text"],
        [{"regex": "slow [0-9]{2}", "max_new_tokens": 8}, {"temperature": 0, "max_new_tokens": 4}],
        None,
        None,
    )
    slow_req, free_req = (engine.scheduler.add_request(t) for t in tokenized)
    while not free_req.finished:
        engine.scheduler.step()
    assert slow_req in engine.scheduler.grammar_queue and not slow_req.output_ids
    while not slow_req.finished:
        engine.scheduler.step()
    assert re.fullmatch("slow [0-9]{2}", engine.output_of(slow_req)["text"])


@pytest.mark.parametrize(
    "params, needle",
    [
        (
            {"json_schema": '{"type": "nonsense"}'},
            'invalid json_schema: Unsupported type "nonsense"',
        ),
        ({"json_schema": "{not json"}, "invalid json_schema: not valid JSON"),
        ({"regex": "a(b"}, "invalid regex"),
        ({"ebnf": "root ::= missing_rule"}, "invalid ebnf"),
        ({"regex": "a", "ebnf": 'root ::= "a"'}, "at most one of"),
        ({"logit_bias": {"999999": 5}}, "outside the vocabulary"),
        ({"logit_bias": {"5": 500}}, "logit_bias values"),
        ({"n": 0}, "n must be"),
        ({}, "top_logprobs_num"),
    ],
)
def test_bad_constraints_raise_and_change_nothing(engine, params, needle) -> None:
    before = engine.generate("steady", {"temperature": 0, "max_new_tokens": 4})
    top = 10**6 if needle == "top_logprobs_num" else 0
    with pytest.raises(ValueError, match=re.escape(needle)):
        engine.generate("x", params, return_logprob=True, top_logprobs_num=top)
    sched = engine.scheduler
    assert not sched.running and not sched.waiting and not sched.grammar_queue
    sched.check_integrity()
    after = engine.generate("steady", {"temperature": 0, "max_new_tokens": 4})
    assert after["output_ids"] == before["output_ids"]


def test_logit_bias_steers_greedy_tokens(engine) -> None:
    greedy = {"temperature": 0, "max_new_tokens": 6}
    free = engine.generate("Bias me", greedy)["output_ids"]
    forced = engine.generate("Bias me", {**greedy, "logit_bias": {"300": 100}})["output_ids"]
    assert forced == [300] * 6
    banned = engine.generate("Bias me", {**greedy, "logit_bias": {str(free[0]): -100}})
    assert banned["output_ids"][0] != free[0]


def test_top_logprobs_match_hf_and_rank_the_chosen_token_first(engine) -> None:
    prompt = "The quick brown fox"
    out = engine.generate(
        prompt, {"temperature": 0, "max_new_tokens": 5}, return_logprob=True, top_logprobs_num=3
    )
    meta = out["meta_info"]
    _, hf_logprobs = hf_greedy(FAMILY, prompt, [], 5)
    chosen = [lp for lp, _, _ in meta["output_token_logprobs"]]
    assert chosen == pytest.approx(hf_logprobs, abs=1e-4)
    for (lp, tok, _), top in zip(meta["output_token_logprobs"], meta["output_top_logprobs"]):
        assert len(top) == 3 and top[0][1] == tok and top[0][0] == pytest.approx(lp)
        assert [t[0] for t in top] == sorted((t[0] for t in top), reverse=True)


def test_n_shares_the_prompt_and_encodes_the_image_once(engine) -> None:
    engine.flush_cache()
    before = engine.get_server_info()["mm_embedding_cache"]["encoded_items"]
    prompt = f"Describe {PH} twice"
    params = {"temperature": 1.0, "max_new_tokens": 6, "n": 3, "seed": 11}
    outs = engine.generate(prompt, params, image_data=make_image(77))
    after = engine.get_server_info()["mm_embedding_cache"]["encoded_items"]
    assert len(outs) == 3 and after - before == 1
    prompt_len = outs[0]["meta_info"]["prompt_tokens"]
    assert all(o["meta_info"]["cached_tokens"] == prompt_len - 1 for o in outs)
    assert len({tuple(o["output_ids"]) for o in outs}) > 1  # seed + i: the choices differ
    again = engine.generate(prompt, params, image_data=make_image(77))
    assert [o["output_ids"] for o in again] == [o["output_ids"] for o in outs]
    engine.scheduler.check_integrity()


def test_seeded_sampling_ignores_batch_neighbours(engine) -> None:
    seeded = {"temperature": 1.0, "max_new_tokens": 8, "seed": 5}
    alone = engine.generate("Seeded story", seeded)
    batch = engine.generate(
        ["other one", "Seeded story", f"image {PH}"],
        [
            {"temperature": 1.0, "max_new_tokens": 12},
            seeded,
            {"temperature": 0.5, "max_new_tokens": 4},
        ],
        image_data=[None, None, make_image(5)],
    )
    assert batch[1]["output_ids"] == alone["output_ids"]


def test_stop_string_is_kept_with_no_stop_trim(engine) -> None:
    free = engine.generate("The quick brown fox", {"temperature": 0, "max_new_tokens": 12})
    text = free["text"]
    stop = next(
        text[i : i + 2] for i in range(3, len(text)) if text[i : i + 2].strip() == text[i : i + 2]
    )
    base = {"temperature": 0, "max_new_tokens": 12, "stop": stop}
    trimmed = engine.generate("The quick brown fox", base)["text"]
    kept = engine.generate("The quick brown fox", {**base, "no_stop_trim": True})["text"]
    assert kept == trimmed + stop and text.startswith(kept)


def test_grammar_end_finishes_even_with_ignore_eos(engine) -> None:
    out = engine.generate(
        "x", {"regex": "(yes|no)", "ignore_eos": True, "max_new_tokens": 20, "temperature": 0}
    )
    assert out["text"] in ("yes", "no") and out["meta_info"]["finish_reason"]["type"] == "stop"


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 10},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                },
                "required": ["city", "days"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
                "required": ["a"],
                "additionalProperties": False,
            },
        },
    },
]


@pytest.mark.parametrize(
    "choice, parallel",
    [("required", True), ("required", False), ({"function": {"name": "add"}}, True)],
)
def test_forced_tool_calls_parse_and_validate(engine, choice, parallel) -> None:
    tag = json.dumps(qwen25.structural_tag(TOOLS, choice, parallel))
    params = [
        {"structural_tag": tag, "max_new_tokens": 160, "temperature": 1.0, "seed": s}
        for s in range(2)
    ]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for out in engine.generate(["Call a tool:"] * 2, params):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out["text"]
        content, calls = qwen25.parse(out["text"])
        assert calls and content is None, out["text"]
        if isinstance(choice, dict):
            assert [c.name for c in calls] == ["add"]
        if not parallel:
            assert len(calls) == 1
        for call in calls:
            jsonschema.validate(json.loads(call.arguments), schemas[call.name])


def test_masks_filled_during_the_forward_give_the_same_tokens(engine, monkeypatch) -> None:
    prompts = ["Masks one", "Masks two", "Masks three"]
    params = [
        {"regex": "[a-z]{3,8}( [a-z]{3,8}){1,3}", "temperature": 0, "max_new_tokens": 40},
        {"temperature": 0, "max_new_tokens": 6},
        {"json_schema": json.dumps({"enum": ["alpha", "beta", 7]}), "temperature": 1.0, "seed": 3},
    ]
    inline = engine.generate(prompts, params)
    monkeypatch.setattr(engine.scheduler.constraints, "overlap_on_thread", True)
    threaded = engine.generate(prompts, params)
    assert [o["output_ids"] for o in threaded] == [o["output_ids"] for o in inline]


def _byte_token(engine: sglang.Engine, byte: int) -> int:
    vocab = engine.scheduler.constraints.backend.info.decoded_vocab
    return list(vocab).index(bytes([byte]))


@pytest.mark.parametrize("kind", ["json_schema", "regex"])
@pytest.mark.parametrize(
    ("lead", "second"),
    [(0xED, 0xA0), (0xE0, 0x90), (0xF0, 0x8A)],
    ids=["surrogate", "overlong-3", "overlong-4"],
)
def test_a_grammar_never_writes_bytes_that_are_not_utf8(engine, kind, lead, second) -> None:
    """xgrammar's matchers accept ED A0..BF (a UTF-16 surrogate in UTF-8's form) and, in a
    bounded JSON string, the overlong E0 80..9F and F0 80..8F: none of them UTF-8. With the
    lead byte and such a second byte pushed to the top, the output still decodes as UTF-8 and
    meets the grammar (the guard's deliberate absence writes replacement characters here)."""
    lead_id, second_id = _byte_token(engine, lead), _byte_token(engine, second)
    constraint = (
        {"json_schema": json.dumps({"type": "string", "maxLength": 4})}
        if kind == "json_schema"
        else {"regex": "[^a]{1,4}"}
    )
    bias = {lead_id: 50.0, second_id: 40.0}
    params = {"temperature": 0, "max_new_tokens": 24, "logit_bias": bias}
    out = engine.generate("Answer:", {**params, **constraint})
    ids = out["output_ids"]
    assert lead_id in ids  # the bias took the lead byte, so the guard had something to block
    text = engine.tokenizer.decode(ids, skip_special_tokens=True)
    raw = b"".join(engine.scheduler.constraints.backend.info.decoded_vocab[i] for i in ids)
    raw.decode("utf-8")  # strict: a surrogate or an overlong form raises here
    assert "\ufffd" not in text
    if kind == "json_schema":
        assert len(json.loads(text)) <= 4
    else:
        assert re.fullmatch("[^a]{1,4}", text)


def test_the_guard_allows_a_second_byte_exactly_when_utf8_does() -> None:
    """Against Python's strict decoder: for each lead byte the guard limits and every
    continuation byte, the guard lets the pair through (in one token, or split over two)
    exactly when the whole character is UTF-8."""
    from sglang.srt.constrained.utf8_guard import Utf8Guard

    def allowed(mask: torch.Tensor, token: int) -> bool:
        return bool((int(mask[token // 32]) >> (token % 32)) & 1)

    for lead in range(0xE0, 0xF5):  # every lead of a 3- or 4-byte character
        length = 3 if lead < 0xF0 else 4
        for second in range(0x80, 0xC0):
            char = bytes([lead, second]) + b"\x80" * (length - 2)
            try:
                char.decode("utf-8")
                valid = True
            except UnicodeDecodeError:
                valid = False
            vocab = [char, bytes([lead]), char[1:]]
            guard = Utf8Guard(vocab, 1)
            assert allowed(guard.anywhere, 0) == valid, char
            limits = guard.lead_at_end(1)
            split = allowed(guard.after_lead[limits], 2) if limits is not None else True
            assert split == valid, char
