"""SGLang's own test kits, from the sglang wheel on PyPI, against this server.

The wheel (``SGLANG_VERSION``, downloaded once into ``$SGLANG_CACHE_DIR/wheels``) ships the
kits (``sglang/test/kits/*``, ``vlm_utils``, ``tool_call_test_runner``, ...) that SGLang's HTTP
tests mix into their test classes. They are extracted into a temporary folder that
``SGLANG_TEST_KITS_DIR`` adds to ``sglang.test``, so that they import this package's
``sglang.test.test_utils`` and launch this server; ``sglang_kit_cases.py`` hosts them on tiny
random-weight models and runs in a pytest subprocess. Every case must pass except those in
``KNOWN``, one reason each; a listed server gap that passes fails the test too (strike it off).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest
from conftest import model_dir
from server_utils import free_port

SGLANG_VERSION = "0.5.23"  # the SGLang release this project follows
RUNNER = Path(__file__).with_name("sglang_kit_cases.py")
RUN_TIMEOUT_S = 1200

NEEDS_MODEL = "needs a real model"  # a random-weight model cannot pass it; passing is allowed
MENDING = "server gap being mended"  # strike off once the server is fixed
GAP = "server gap"  # ours differs from SGLang; nobody is on it yet
DESIGN = "differs by design"  # ours behaves otherwise on purpose
STRICT = (MENDING, GAP, DESIGN)  # these must fail: one that passes is struck off

# Every kit case that does not pass, and why: "kit::case" -> (category, reason).
KNOWN: dict[str, tuple[str, str]] = {
    # basic_decode_correctness_kit: answers a model has to know
    "basic_decode_correctness_kit::test_capital_france": (NEEDS_MODEL, "'paris' in the answer"),
    "basic_decode_correctness_kit::test_basic_math": (NEEDS_MODEL, "'391' in the answer"),
    "basic_decode_correctness_kit::test_color_completion": (NEEDS_MODEL, "'yellow' in it"),
    "basic_decode_correctness_kit::test_ascii_ratio": (
        NEEDS_MODEL,
        "English output; random output passes only as the tiny vocabulary is mostly ASCII",
    ),
    "basic_decode_correctness_kit::test_no_repetition_blowup": (
        NEEDS_MODEL,
        "no looping 5-gram; random output may or may not loop",
    ),
    "basic_scheduler_stress_kit::test_streaming_response": (NEEDS_MODEL, "'paris' in it"),
    "basic_scheduler_stress_kit::test_concurrent_requests": (
        NEEDS_MODEL,
        "7 of 8 capitals named",
    ),
    # constrained decoding: the grammar leaves a free run that a random model never ends
    "ebnf_constrained_kit::test_ebnf_generate_complex_json": (
        NEEDS_MODEL,
        "the grammar allows one pair; the pattern wants name, age and city, as the prompt asks",
    ),
    "ebnf_constrained_kit::test_ebnf_generate_custom_log_format": (
        NEEDS_MODEL,
        "[a-z]+ runs to max_new_tokens=128, the text is cut before ' successfully'",
    ),
    "regex_constrained_kit::test_regex_generate_complex_json": (
        NEEDS_MODEL,
        "a \\s* or string run reaches max_new_tokens=128 before the object closes",
    ),
    "regex_constrained_kit::test_regex_generate_custom_log_format": (
        NEEDS_MODEL,
        "[a-z]+ runs to max_new_tokens=128",
    ),
    "json_constrained_kit::test_json_generate": (
        NEEDS_MODEL,
        "the name string runs to max_new_tokens=128: unterminated JSON",
    ),
    "json_constrained_kit::test_json_openai": (
        NEEDS_MODEL,
        "the name string runs to max_tokens=128: unterminated JSON",
    ),
    "json_constrained_kit::test_mix_json_and_other": (
        NEEDS_MODEL,
        "the name string runs to max_new_tokens=128: unterminated JSON",
    ),
    "json_mode_kit::test_json_mode_response": (
        NEEDS_MODEL,
        "json_object: a random model closes the object within 128 tokens only by chance",
    ),
    "json_mode_kit::test_json_mode_with_streaming": (
        NEEDS_MODEL,
        "json_object, streamed: the object closes within 128 tokens only by chance",
    ),
    "matched_stop_kit::test_finish_stop_str": (
        NEEDS_MODEL,
        "a '\\n' within 1,000 tokens; random text has none (finish_reason 'length')",
    ),
    "matched_stop_kit::test_finish_stop_eos": (
        NEEDS_MODEL,
        "the model must end itself, and matched_stop must be one of Llama 3's EOS ids",
    ),
    # reasoning_kit on the tiny Qwen3.5 (--reasoning-parser qwen3)
    "reasoning_kit::test_reasoning_tokens_thinking": (
        NEEDS_MODEL,
        "reasoning_tokens < completion_tokens: the model must close </think>",
    ),
    "reasoning_kit::test_reasoning_tokens_thinking_stream": (
        NEEDS_MODEL,
        "reasoning_tokens < completion_tokens, streamed: the model must close </think>",
    ),
    "reasoning_kit::test_reasoning_tokens_generate_exact_count": (
        NEEDS_MODEL,
        "output_ids must hold </think> (the count up to it is checked)",
    ),
    "reasoning_kit::test_streaming_separate_reasoning_true": (
        NEEDS_MODEL,
        "content after </think>: sampled (no temperature), a random model closes it by chance",
    ),
    "reasoning_kit::test_streaming_separate_reasoning_true_stream_reasoning_false": (
        NEEDS_MODEL,
        "content after </think>: sampled, a random model closes it by chance",
    ),
    "reasoning_kit::test_nonstreaming_separate_reasoning_true": (
        NEEDS_MODEL,
        "content after </think>: sampled, a random model closes it by chance",
    ),
    "prefix_cache_branching_kit::test_prefix_cache_branching": (
        DESIGN,
        "SGLang's hybrid cache keeps a branch point only once a 2nd request splits there; ours "
        "snapshots prompt-chunk ends, so the 2nd request already reuses 512 of 513 shared tokens",
    ),
    # vlm_utils: descriptions of the real pictures
    "vlm_utils::test_single_image_chat_completion": (NEEDS_MODEL, "man, car and iron named"),
    "vlm_utils::test_multi_turn_chat_completion": (
        NEEDS_MODEL,
        "'man' or 'cab' in the answer (random text may hold 'man', as in 'many')",
    ),
    "vlm_utils::test_multi_images_chat_completion": (NEEDS_MODEL, "car and logo named"),
    "vlm_utils::test_video_chat_completion": (NEEDS_MODEL, "iPod, man, black named"),
    "vlm_utils::test_video_images_chat_completion": (
        NEEDS_MODEL,
        "iPod and man named; it also imports SGLang's sglang.srt.utils.video_decoder",
    ),
    # tool_call_test_runner (--tool-call-parser qwen25)
    "tool_call_test_runner::none": (
        NEEDS_MODEL,
        "finish_reason 'stop': the model must end itself (here: 'length' at the context end)",
    ),
    "tool_call_test_runner::multiturn": (
        NEEDS_MODEL,
        "'8' in the answer to the tool result (random text may hold one)",
    ),
    "tool_call_test_runner::parallel": (NEEDS_MODEL, "two tool calls under tool_choice auto"),
}


def _cache_dir() -> Path:
    return Path(os.environ.get("SGLANG_CACHE_DIR") or Path.home() / ".cache" / "sglang")


def sglang_wheel() -> Path:
    """The sglang wheel of ``SGLANG_VERSION``, from the cache or pip (the package registry is
    reachable wherever the suite installs its packages; a failed download fails the test)."""
    folder = _cache_dir() / "wheels"
    pattern = f"sglang-{SGLANG_VERSION}-*.whl"
    found = sorted(folder.glob(pattern))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet"]
        cmd += [f"sglang=={SGLANG_VERSION}", "-d", str(folder)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        found = sorted(folder.glob(pattern))
        if not found:
            pytest.fail(f"sglang=={SGLANG_VERSION} not cached and not downloadable: {proc.stderr}")
    return found[-1]


def extract_kits(wheel: Path, dest: Path) -> Path:
    """The wheel's ``sglang/test/`` files but ``__init__`` and ``test_utils`` (ours serve)."""
    prefix, ours = "sglang/test/", {"__init__.py", "test_utils.py"}
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            rel = name[len(prefix) :]
            if name.startswith(prefix) and rel and rel not in ours and not name.endswith("/"):
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(name))
    return dest


def junit_outcomes(path: Path) -> dict[str, tuple[str, str]]:
    """``Host.test_x`` -> (passed | failed | skipped, message) from pytest's JUnit XML."""
    outcomes = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        key = f"{case.get('classname', '').rsplit('.', 1)[-1]}.{case.get('name')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = "failed", child.get("message") or ""
            elif child.tag == "skipped" and outcome == "passed":
                outcome, message = "skipped", child.get("message") or ""
        outcomes[key] = (outcome, message)
    return outcomes


def compare(cases: dict[str, str], outcomes: dict[str, tuple[str, str]]) -> list[str]:
    """What is wrong with a run: failing cases not in ``KNOWN``, listed gaps that pass, cases
    that did not run, and ``KNOWN`` entries for cases that no longer exist."""
    problems = []
    for host_case, case in sorted(cases.items(), key=lambda kv: kv[1]):
        outcome, message = outcomes.get(host_case, ("missing", "did not run"))
        known = KNOWN.get(case)
        if outcome in ("failed", "missing", "skipped") and known is None:
            problems.append(f"{case}: {outcome} and not in KNOWN: {message[:500]}")
        elif outcome == "passed" and known is not None and known[0] in STRICT:
            problems.append(f"{case}: passes now; strike it off KNOWN ({known[0]})")
    stale = sorted(set(KNOWN) - set(cases.values()))
    problems += [f"{case}: in KNOWN but not a kit case" for case in stale]
    return problems


def table(cases: dict[str, str], outcomes: dict[str, tuple[str, str]]) -> str:
    rows = ["| kit case | outcome | category: reason |", "|---|---|---|"]
    for host_case, case in sorted(cases.items(), key=lambda kv: kv[1]):
        outcome = outcomes.get(host_case, ("missing", ""))[0]
        known = KNOWN.get(case)
        rows.append(f"| `{case}` | {outcome} | {f'{known[0]}: {known[1]}' if known else ''} |")
    return "\n".join(rows)


def test_sglang_kits_against_this_server(tmp_path: Path) -> None:
    kits = extract_kits(sglang_wheel(), tmp_path / "sglang_test")
    work = tmp_path / "work"
    work.mkdir()
    junit, log_path = tmp_path / "junit.xml", tmp_path / "kits.log"
    env = {
        **os.environ,
        "SGLANG_TEST_KITS_DIR": str(kits),
        "SGLANG_TEST_URL": f"http://127.0.0.1:{free_port()}",
        "SGLANG_KITS_WORK_DIR": str(work),
        "SGLANG_KITS_TEXT_MODEL": model_dir("qwen2"),
        "SGLANG_KITS_VLM_MODEL": model_dir("qwen2_5_vl"),
        "SGLANG_KITS_HYBRID_MODEL": model_dir("qwen3_5"),
        "PYTHONUNBUFFERED": "1",
    }
    cmd = [sys.executable, "-m", "pytest", str(RUNNER), "-q", "-rA", "--noconftest"]
    cmd += ["-p", "no:cacheprovider", "-o", "addopts=", f"--junitxml={junit}"]
    start = time.monotonic()
    with open(log_path, "w") as log:
        # A session of its own: on a timeout the servers it started go down with it.
        proc = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    elapsed = time.monotonic() - start
    tail = log_path.read_text(errors="replace")[-6000:]
    assert proc.returncode in (0, 1) and junit.exists(), f"the kit run broke:\n{tail}"

    cases = json.loads((work / "cases.json").read_text())
    outcomes = junit_outcomes(junit)
    summary = table(cases, outcomes)
    (tmp_path / "results.md").write_text(summary + "\n")
    passed = sum(o == "passed" for o, _ in outcomes.values())
    print(f"\n{summary}\n{passed} of {len(cases)} kit cases passed in {elapsed:.0f} s")
    problems = compare(cases, outcomes)
    assert not problems, "\n".join(problems) + f"\n\nlog tail:\n{tail}"


# The helpers under SGLang's names, apart from the kits -------------------------------------
def test_popen_launch_server_raises_when_the_server_exits() -> None:
    from sglang.test.test_utils import popen_launch_server

    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(Exception, match="exited with code 2"):
        popen_launch_server(model_dir("qwen2"), url, timeout=60, other_args=["--no-such-flag"])


def test_kill_process_tree_kills_children_and_skips_one() -> None:
    import psutil

    from sglang.srt.utils import kill_process_tree

    script = "import subprocess, sys, time\n"
    script += "kids = [subprocess.Popen(['sleep', '60']) for _ in range(2)]\n"
    script += "print(' '.join(str(k.pid) for k in kids), flush=True)\ntime.sleep(60)\n"
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    spared, killed = (int(pid) for pid in parent.stdout.readline().split())
    kill_process_tree(parent.pid, skip_pid=spared)
    parent.wait(timeout=10)
    assert not psutil.pid_exists(killed) or psutil.Process(killed).status() == "zombie"
    assert psutil.Process(spared).is_running()
    kill_process_tree(spared)
