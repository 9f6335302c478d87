"""SGLang frontend programs (``@sgl.function``) run against a live server.

Runs in a venv that has SGLang's own package (``sglang==0.5.23``, see sglang_frontend.sh), not
this project's: ``python frontend_programs.py --url http://127.0.0.1:30000``. Each program is
checked for an answer of the right form (the tiny test model writes nonsense, so the words are
not checked); prints one line per program and exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import sglang as sgl

DIGITS = r"[0-9]{3}"
COLORS = [" blue", " red", " green"]


@sgl.function
def plain_gen(s, question: str):
    s += "Question: " + question + "\nAnswer:"
    s += sgl.gen("answer", max_tokens=12, temperature=0, stop=["\n\n"])


@sgl.function
def chat_gen(s, question: str):
    s += sgl.system("You are a terse assistant.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=12, temperature=0))


@sgl.function
def healed_select(s):
    # The prompt ends in a space and the choices start with one: token healing at work.
    s += "The colour of a clear sky is "
    s += sgl.select("color", choices=COLORS)


@sgl.function
def regex_gen(s):
    s += "Three digits: "
    s += sgl.gen("number", max_tokens=8, temperature=0, regex=DIGITS)


@sgl.function
def int_gen(s):
    s += "A number: "
    s += sgl.gen("value", max_tokens=8, temperature=0, dtype=int)


@sgl.function
def stop_regex_gen(s):
    s += "Count: one two three"
    s += sgl.gen("rest", max_tokens=48, temperature=0, ignore_eos=True, stop_regex=r"[a-z]\s")


@sgl.function
def fork_join(s):
    s += "Give three tips.\n"
    forks = s.fork(3)
    forks += lambda i: f"Tip {i + 1}:" + sgl.gen("tip", max_tokens=8, temperature=0, stop="\n")
    forks.join()
    s += "Summary:" + sgl.gen("summary", max_tokens=8, temperature=0)


@sgl.function
def batch_item(s, topic: str):
    s += "A long shared preamble that every item of the batch begins with, to be cached. " * 3
    s += f"Topic: {topic}. One word:" + sgl.gen("word", max_tokens=6, temperature=0)


@sgl.function
def streamed(s):
    s += "Tell a story:" + sgl.gen("story", max_tokens=24, temperature=0, ignore_eos=True)


@sgl.function
def image_chat(s, image_path: str):
    s += sgl.user(sgl.image(image_path) + "What is in this image?")
    s += sgl.assistant(sgl.gen("answer", max_tokens=12, temperature=0))


@sgl.function
def image_select(s, image_path: str):
    s += sgl.user(sgl.image(image_path) + "Is it a cat or a dog?")
    s += sgl.assistant(sgl.select("animal", choices=["cat", "dog"]))


# Checks ------------------------------------------------------------------------------------------
def _text(state: Any, name: str) -> str:
    assert state.error() is None, state.error()
    value = state[name]
    assert isinstance(value, str), f"{name} is {value!r}"
    return value


def check_gen() -> str:
    state = plain_gen.run(question="What is two plus two?")
    meta = state.get_meta_info("answer")
    assert meta["completion_tokens"] >= 1 and meta["finish_reason"]["type"] in ("stop", "length")
    return _text(state, "answer")


def check_chat() -> str:
    state = chat_gen.run(question="Name a colour.")
    assert "<|im_start|>assistant" in state.text(), state.text()
    return _text(state, "answer")


def check_select() -> str:
    state = healed_select.run()
    color = _text(state, "color")
    assert color in COLORS, color
    meta = state.get_meta_info("color")
    assert len(meta["normalized_prompt_logprobs"]) == len(COLORS)
    return color


def check_regex() -> str:
    number = _text(regex_gen.run(), "number")
    assert re.fullmatch(DIGITS, number), number
    return number


def check_int() -> str:
    value = _text(int_gen.run(), "value")
    assert re.fullmatch(r"[-+]?[0-9]+", value.strip()), value
    return value


def check_stop_regex() -> str:
    state = stop_regex_gen.run()
    rest = _text(state, "rest")
    reason = state.get_meta_info("rest")["finish_reason"]
    # SGLang reports the pattern, and the text it matched stays in the output.
    assert reason["type"] == "length" or (
        reason["matched"] == r"[a-z]\s" and re.search(r"[a-z]\s", rest)
    ), (reason, rest)
    return f"{rest!r} ({reason['type']})"


def check_fork() -> str:
    state = fork_join.run()
    tips = state["tip"]
    assert isinstance(tips, list) and len(tips) == 3 and all(isinstance(t, str) for t in tips)
    return f"{tips} / {_text(state, 'summary')!r}"


def check_run_batch() -> str:
    topics = ["sea", "sky", "stone", "tree"]
    states = batch_item.run_batch([{"topic": t} for t in topics], num_threads=4)
    words = [_text(state, "word") for state in states]
    assert len(words) == len(topics)
    return repr(words)


def check_stream() -> str:
    state = streamed.run(stream=True)
    pieces = list(state.text_iter("story"))
    story = _text(state, "story")
    assert "".join(pieces) == story and len(pieces) > 1, (pieces, story)
    return f"{len(pieces)} pieces: {story!r}"


def check_image_chat(image_path: str) -> str:
    state = image_chat.run(image_path=image_path)
    meta = state.get_meta_info("answer")
    assert meta["prompt_tokens"] > 20, meta  # the image's placeholder tokens are in the prompt
    return _text(state, "answer")


def check_image_select(image_path: str) -> str:
    animal = _text(image_select.run(image_path=image_path), "animal")
    assert animal in ("cat", "dog"), animal
    return animal


def _image() -> str:
    from PIL import Image

    path = tempfile.NamedTemporaryFile(suffix=".png", delete=False).name
    Image.effect_noise((96, 64), 64).convert("RGB").save(path)
    return path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    args = parser.parse_args()
    backend = sgl.RuntimeEndpoint(args.url)
    sgl.set_default_backend(backend)
    image = _image()
    checks: dict[str, Callable[[], str]] = {
        "gen": check_gen,
        "chat template gen": check_chat,
        "select (token healing)": check_select,
        "regex": check_regex,
        "gen dtype=int": check_int,
        "stop_regex": check_stop_regex,
        "fork / join": check_fork,
        "run_batch": check_run_batch,
        "streaming": check_stream,
        "image chat": lambda: check_image_chat(image),
        "image select": lambda: check_image_select(image),
    }
    failed = 0
    for name, check in checks.items():
        start = time.perf_counter()
        try:
            outcome = f"PASS {check()}"
        except Exception:
            failed += 1
            outcome = "FAIL\n" + traceback.format_exc()
        print(f"{name:24s} {time.perf_counter() - start:5.2f}s {outcome}", flush=True)
    backend.flush_cache()
    print(f"{len(checks) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
