"""The CLI is derived from the ServerArgs dataclass, with SGLang's flag names."""

from __future__ import annotations

import argparse

import pytest

from sglang.launch_server import parse_args
from sglang.srt.server_args import ServerArgs


def test_flags_parse_into_the_frozen_dataclass() -> None:
    args = parse_args(
        [
            "--model-path",
            "/m",
            "--chunked-prefill-size",
            "-1",
            "--port",
            "31000",
            "--disable-radix-cache",
            "--enable-multimodal",
            "--mm-cache-mode",
            "combined",
            "--limit-mm-data-per-request",
            '{"image": 2}',
            "--mem-fraction-static",
            "0.7",
        ]
    )
    assert args.model_path == "/m" and args.chunked_prefill_size == -1 and args.port == 31000
    assert args.disable_radix_cache and args.enable_multimodal
    assert args.mm_cache_mode == "combined" and args.image_limit == 2
    assert args.mem_fraction_static == 0.7
    with pytest.raises(AttributeError):
        args.port = 1  # type: ignore[misc]


def test_defaults_match_sglang() -> None:
    args = parse_args([])
    assert (args.host, args.port, args.max_prefill_tokens) == ("127.0.0.1", 30000, 16384)
    assert args.model_path is None and not args.disable_radix_cache and args.api_key is None
    assert ServerArgs().mm_cache_bytes == 100 * 2**20


@pytest.mark.parametrize(
    "flags",
    [
        ["--mm-cache-mode", "bogus"],
        ["--chunked-prefill-size", "0"],
        ["--limit-mm-data-per-request", "not json"],
        ["--schedule-policy", "lpm"],
    ],
)
def test_invalid_values_are_rejected(flags: list[str]) -> None:
    with pytest.raises(ValueError):
        parse_args(flags)


# SGLang's launch flags that users bring (its docs; values that parse, and the field they set).
SGLANG_FLAGS = {
    "--model-path": ("/m", "model_path", "/m"),
    "--host": ("0.0.0.0", "host", "0.0.0.0"),
    "--port": ("31234", "port", 31234),
    "--chunked-prefill-size": ("512", "chunked_prefill_size", 512),
    "--max-running-requests": ("7", "max_running_requests", 7),
    "--max-prefill-tokens": ("4096", "max_prefill_tokens", 4096),
    "--context-length": ("2048", "context_length", 2048),
    "--mem-fraction-static": ("0.5", "mem_fraction_static", 0.5),
    "--served-model-name": ("m", "served_model_name", "m"),
    "--chat-template": ("qwen2-vl", "chat_template", "qwen2-vl"),
    "--api-key": ("k", "api_key", "k"),
    "--log-level": ("debug", "log_level", "debug"),
    "--mm-attention-backend": ("sdpa", "mm_attention_backend", "sdpa"),
    "--attention-backend": ("torch_native", "attention_backend", "torch_native"),
}
SGLANG_SWITCHES = {
    "--enable-multimodal": "enable_multimodal",
    "--disable-radix-cache": "disable_radix_cache",
    "--enable-metrics": "enable_metrics",
    "--enable-cache-report": "enable_cache_report",
}


@pytest.mark.parametrize("flag", SGLANG_FLAGS)
def test_sglang_flags_set_their_fields(flag: str) -> None:
    value, field, parsed = SGLANG_FLAGS[flag]
    assert getattr(parse_args([flag, value]), field) == parsed


@pytest.mark.parametrize("flag", SGLANG_SWITCHES)
def test_sglang_switches_turn_their_fields_on(flag: str) -> None:
    field = SGLANG_SWITCHES[flag]
    assert not getattr(parse_args([]), field)  # off, or (--enable-multimodal) decided by the model
    assert getattr(parse_args([flag]), field) is True


def test_every_field_has_a_flag_with_the_fields_default() -> None:
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    dests = {a.dest: a for a in parser._actions}
    for name in ServerArgs.__dataclass_fields__:
        assert f"--{name.replace('_', '-')}" in dests[name].option_strings
    assert parse_args([]) == ServerArgs()  # the CLI's defaults are the dataclass's


@pytest.mark.parametrize("flag", ["--tp-size", "--tensor-parallel-size", "--tp"])
def test_tensor_parallel_flags_take_one_and_refuse_more(flag: str) -> None:
    """lmms-eval's srt_api backend and SGLang's scripts pass ``--tp 1``: one process serves."""
    assert parse_args([flag, "1"]).tp_size == 1
    with pytest.raises(ValueError, match="only --tp-size 1"):
        parse_args([flag, "2"])


def test_a_named_sglang_template_keeps_the_models_own() -> None:
    """``--chat-template chatml-llava`` (what lmms-eval's srt_api passes) must not become the
    literal prompt; Jinja, inline, still replaces the model's template."""
    from types import SimpleNamespace

    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.entrypoints.openai.serving_chat import render_chat

    class Tokenizer:
        chat_template = "{{ messages[0]['content'] }}!"

        def apply_chat_template(self, messages, chat_template=None, **kwargs) -> str:
            template = chat_template or self.chat_template
            return template.replace("{{ messages[0]['content'] }}", messages[0]["content"])

    manager = SimpleNamespace(tokenizer=Tokenizer())
    body = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}])
    named = render_chat(manager, body, ServerArgs(chat_template="chatml-llava"))
    assert named.prompt == "hi!"
    inline = "<{{ messages[0]['content'] }}>"
    assert render_chat(manager, body, ServerArgs(chat_template=inline)).prompt == "<hi>"
