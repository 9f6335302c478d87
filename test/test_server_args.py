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


def test_every_field_has_a_flag() -> None:
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    flags = {a.dest for a in parser._actions}
    assert {f for f in ServerArgs.__dataclass_fields__} <= flags
