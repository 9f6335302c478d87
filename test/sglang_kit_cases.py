"""SGLang's test kits, hosted against this server: one ``CustomTestCase`` per server setup,
mixing in the kits' mixins as SGLang's own test files do. ``test_sglang_conformance.py`` runs
this file in a pytest subprocess (the suite does not collect it: no ``test_`` prefix) with:

- ``SGLANG_TEST_KITS_DIR``: the wheel's ``sglang/test/`` files, less ``__init__`` and
  ``test_utils`` (``sglang.test`` reads the folder, see ``python/sglang/test/__init__.py``);
- ``SGLANG_TEST_URL``: the URL every server of the run listens on, one after another;
- ``SGLANG_KITS_TEXT_MODEL``, ``SGLANG_KITS_VLM_MODEL``, ``SGLANG_KITS_HYBRID_MODEL``: tiny
  checkouts (text-only Qwen2, Qwen2.5-VL, Qwen3.5 with ``<think>``);
- ``SGLANG_KITS_WORK_DIR``: scratch space (media, the KL kit's prompts, ``cases.json``).

The kits' requests go out unchanged. What a host sets are the kits' own knobs (which model and
flags, the KL kit's sample counts and threshold) and the media URLs, which point at a local HTTP
server instead of GitHub (the images and the clip are random pixels made here).
"""

from __future__ import annotations

import functools
import http.server
import io
import json
import os
import sys
import threading
import types
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

if not os.environ.get("SGLANG_TEST_KITS_DIR"):
    pytest.skip("run by test_sglang_conformance.py", allow_module_level=True)

import openai  # noqa: E402
import requests  # noqa: E402
from PIL import Image  # noqa: E402

from sglang.srt.entrypoints.reasoning_parser import PARSERS  # noqa: E402
from sglang.test.test_utils import (  # noqa: E402
    DEFAULT_TIMEOUT_FOR_SERVER_LAUNCH,
    DEFAULT_URL_FOR_TEST,
    CustomTestCase,
    ModelLaunchSettings,
    popen_launch_server,
    terminate_and_kill_process_tree,
)
from sglang_dev.video_clips import encode_clip, random_frames  # noqa: E402


def _reasoning_parser_module() -> types.ModuleType:
    """What the reasoning kit imports from SGLang's ``sglang.srt.parser.reasoning_parser``: a
    ``ReasoningParser`` whose ``detector.think_end_token`` is the parser's closing tag."""

    class ReasoningParser:
        def __init__(self, model_type: str, tokenizer: Any = None, **_: Any) -> None:
            start, end = PARSERS[model_type]
            self.detector = types.SimpleNamespace(think_start_token=start, think_end_token=end)

    module = types.ModuleType("sglang.srt.parser.reasoning_parser")
    module.ReasoningParser = ReasoningParser  # type: ignore[attr-defined]
    return module


sys.modules.setdefault("sglang.srt.parser", types.ModuleType("sglang.srt.parser"))
sys.modules.setdefault("sglang.srt.parser.reasoning_parser", _reasoning_parser_module())

from sglang.test import kl_test_utils, tool_call_test_runner, vlm_utils  # noqa: E402
from sglang.test.kits.abort_timeout_kit import (  # noqa: E402
    AbortAllMixin,
    RunningTimeoutTwoWaveMixin,
    WaitingTimeoutMixin,
)
from sglang.test.kits.basic_api_contract_kit import BasicAPIContractMixin  # noqa: E402
from sglang.test.kits.basic_decode_correctness_kit import (  # noqa: E402
    BasicDecodeCorrectnessMixin,
)
from sglang.test.kits.basic_scheduler_stress_kit import BasicSchedulerStressMixin  # noqa: E402
from sglang.test.kits.ebnf_constrained_kit import EBNFConstrainedMixin  # noqa: E402
from sglang.test.kits.json_constrained_kit import JSONConstrainedMixin  # noqa: E402
from sglang.test.kits.json_mode_kit import JSONModeMixin  # noqa: E402
from sglang.test.kits.kl_divergence_kit import KLDivergenceMixin  # noqa: E402
from sglang.test.kits.matched_stop_kit import MatchedStopMixin  # noqa: E402
from sglang.test.kits.pause_generation_kit import PauseResumeInPlaceMixin  # noqa: E402
from sglang.test.kits.prefix_cache_branching_kit import PrefixCacheBranchingMixin  # noqa: E402
from sglang.test.kits.reasoning_kit import (  # noqa: E402
    ReasoningTokenUsageMixin,
    SeparateReasoningMixin,
)
from sglang.test.kits.regex_constrained_kit import RegexConstrainedMixin  # noqa: E402

WORK = Path(os.environ.get("SGLANG_KITS_WORK_DIR", "."))
TEXT_MODEL = os.environ.get("SGLANG_KITS_TEXT_MODEL", "")
VLM_MODEL = os.environ.get("SGLANG_KITS_VLM_MODEL", "")
HYBRID_MODEL = os.environ.get("SGLANG_KITS_HYBRID_MODEL", "")
# Every server: quiet, and seeded, so that the kits' sampled requests (no temperature given)
# draw the same tokens on every run.
COMMON_ARGS = ["--log-level", "warning", "--random-seed", "0"]


# Media: the kits' GitHub files, stood in for by random pixels under the same names ----------
class _Media:
    """A local HTTP server for the kits' image and video URLs."""

    NAMES: ClassVar[dict[str, str]] = {
        "IMAGE_MAN_IRONING_URL": "man_ironing_on_back_of_suv.png",
        "IMAGE_SGL_LOGO_URL": "sgl_logo.png",
        "VIDEO_JOBS_URL": "jobs_presenting_ipod.mp4",
    }

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        for seed, name in enumerate(self.NAMES.values()):
            if name.endswith(".png"):
                pixels = np.random.default_rng(seed).integers(0, 256, (96, 128, 3), np.uint8)
                buf = io.BytesIO()
                Image.fromarray(pixels).save(buf, format="PNG")
                (root / name).write_bytes(buf.getvalue())
            else:
                (root / name).write_bytes(encode_clip(random_frames(seed, 12, 64, 64)))
        handler = functools.partial(_QuietHandler, directory=str(root))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def patch_vlm_utils(self) -> None:
        for constant, name in self.NAMES.items():
            setattr(vlm_utils, constant, f"{self.url}/{name}")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


_MEDIA: _Media | None = None


def setUpModule() -> None:  # noqa: N802 (unittest's name)
    global _MEDIA
    _MEDIA = _Media(WORK / "media")
    _MEDIA.patch_vlm_utils()
    _write_kl_prompts()


def tearDownModule() -> None:  # noqa: N802
    if _MEDIA is not None:
        _MEDIA.httpd.shutdown()


def _write_kl_prompts() -> None:
    """The KL kit's prompts, where it looks for its LongBench download: 48 random token
    sequences of 64 to 320 tokens (the kit truncates LongBench texts to 1,500-4,500 tokens;
    shorter ones keep the run within minutes on two CPU cores)."""
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    cache = WORK / "longbench"
    cache.mkdir(parents=True, exist_ok=True)
    kl_test_utils.CACHE_DIR = str(cache)
    tokenizer = get_tokenizer(TEXT_MODEL)
    vocab = len(tokenizer) - len(tokenizer.all_special_ids) - 32
    rng = np.random.default_rng(0)
    prompts = [
        rng.integers(0, vocab, int(rng.integers(64, 321))).tolist()
        for _ in range(kl_test_utils.DEFAULT_NUM_SAMPLES)
    ]
    safe = TEXT_MODEL.replace("/", "_").replace("\\", "_")
    name = f"input_ids_{safe}_{kl_test_utils.DEFAULT_PROMPT_TOKENS}"
    (cache / f"{name}_{kl_test_utils.DEFAULT_NUM_SAMPLES}.json").write_text(json.dumps(prompts))


# Hosts ---------------------------------------------------------------------------------------
class _Server(CustomTestCase):
    """One server for the class, launched as SGLang's tests launch theirs."""

    model: ClassVar[str] = ""
    other_args: ClassVar[list[str]] = []
    env: ClassVar[dict[str, str]] = {}
    api_key: ClassVar[str | None] = None  # what the kits send
    server_api_key: ClassVar[str | None] = None  # what the server requires

    @classmethod
    def setUpClass(cls) -> None:
        cls.base_url = DEFAULT_URL_FOR_TEST
        cls.process = popen_launch_server(
            cls.model,
            cls.base_url,
            timeout=DEFAULT_TIMEOUT_FOR_SERVER_LAUNCH,
            api_key=cls.server_api_key,
            other_args=[*cls.other_args, *COMMON_ARGS],
            env=cls.env,
        )
        cls.client = openai.Client(api_key=cls.api_key or "EMPTY", base_url=cls.base_url + "/v1")

    @classmethod
    def tearDownClass(cls) -> None:
        if getattr(cls, "process", None) is not None:
            terminate_and_kill_process_tree(cls.process, terminate_timeout=30)

    @classmethod
    def flush_cache(cls) -> None:
        requests.post(cls.base_url + "/flush_cache", timeout=30).raise_for_status()


class TextKits(
    _Server,
    BasicAPIContractMixin,
    BasicDecodeCorrectnessMixin,
    BasicSchedulerStressMixin,
    EBNFConstrainedMixin,
    RegexConstrainedMixin,
    JSONConstrainedMixin,
    JSONModeMixin,
    MatchedStopMixin,
    KLDivergenceMixin,
    AbortAllMixin,
    PauseResumeInPlaceMixin,
):
    """The text-only kits on the tiny Qwen2, in float32 (the exact mode), with room for the
    stress kit's 8,000-token prompt."""

    model = TEXT_MODEL
    other_args = ["--dtype", "float32", "--context-length", "16384"]
    kl_div_thres = 1e-6  # float32: prefill and decode logprobs agree to ~1e-12
    kl_div_max_samples = 16
    kl_div_prefill_max_new_tokens = 128
    kl_div_decode_max_new_tokens = 128


class WaitingTimeoutKits(_Server, WaitingTimeoutMixin, RunningTimeoutTwoWaveMixin):
    """SGLang's timeouts: with one request running at a time, the others time out waiting
    (503); one that runs past the running timeout ends with a 503 too. The first request of the
    waiting kit must run longer than the waiting timeout, and less than the running one."""

    model = TEXT_MODEL
    other_args = ["--max-running-requests", "1"]
    env = {"SGLANG_REQ_WAITING_TIMEOUT": "1", "SGLANG_REQ_RUNNING_TIMEOUT": "20"}
    waiting_timeout_max_new_tokens = 2048  # ~4 s of decode here, well over the 1 s


class HybridKits(_Server, ReasoningTokenUsageMixin, SeparateReasoningMixin):
    """The reasoning kits on the tiny Qwen3.5 (``<think>`` tokens, thinking by default)."""

    model = HYBRID_MODEL
    other_args = ["--reasoning-parser", "qwen3"]
    api_key = "EMPTY"  # the kits' OpenAI client needs one; the server asks for none
    reasoning_parser_name = "qwen3"

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.init_reasoning_token_verifier()


class HybridPrefixKits(_Server, PrefixCacheBranchingMixin):
    """Prefix-cache branching on the hybrid model's state snapshots, chunked as the kit's
    ``cache_chunk_size`` says."""

    model = HYBRID_MODEL
    cache_chunk_size = 64
    other_args = ["--chunked-prefill-size", "64"]


class VLMKits(vlm_utils.ImageOpenAITestMixin, vlm_utils.VideoOpenAITestMixin):
    """SGLang's VLM kit on the tiny Qwen2.5-VL, launched by the kit's own base class (API key
    ``sk-123456``); its media come from the local HTTP server, which a private address
    needs ``--allow-private-media-urls`` for, and the clip, which the kit downloads first, from a
    folder ``--allowed-local-media-path`` opens."""

    model = VLM_MODEL
    extra_args = [
        "--allow-private-media-urls",
        "--allowed-local-media-path",
        str(WORK / "downloads"),
        # Requests without max_tokens run to the context's end (~5 s each here); the kit's
        # video requests ask for 1,024 tokens.
        "--context-length",
        "1536",
        *COMMON_ARGS,
    ]

    def get_or_download_file(self, url: str) -> str:
        # The kit caches downloads in ~/.cache under the real file's name: not these pixels.
        folder = WORK / "downloads"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / url.rsplit("/", 1)[-1]
        if not path.exists():
            resp = requests.get(url, timeout=30)
            resp.raise_for_status()
            path.write_bytes(resp.content)
        return str(path)


class ToolCallKits(CustomTestCase):
    """SGLang's tool-call runner (it launches its own server through ``popen_launch_server``
    and ``ModelLaunchSettings``), one case per check it runs."""

    results: ClassVar[dict[str, str | None]] = {}

    @classmethod
    def setUpClass(cls) -> None:
        settings = ModelLaunchSettings(
            VLM_MODEL, extra_args=["--tool-call-parser", "qwen25", "--context-length", "1024"]
        )
        settings.extra_args += COMMON_ARGS
        result = tool_call_test_runner.run_tool_call_test(
            settings, tool_call_test_runner.ToolCallTestParams(), base_url=DEFAULT_URL_FOR_TEST
        )
        if result.num_total == 0:
            raise RuntimeError(f"the tool-call runner ran nothing: {result.failures}")
        failures = dict(f.split(": ", 1) for f in result.failures)
        cls.results = {name: failures.get(name) for name, _, _ in _TOOL_CASES}

    def _check(self, name: str) -> None:
        failure = self.results.get(name)
        if failure is not None:
            self.fail(failure or f"{name}: an assertion of the kit failed (no message)")


_TOOL_CASES = [
    case
    for case in tool_call_test_runner._TESTS
    if getattr(tool_call_test_runner.ToolCallTestParams(), case[2])
]


def _tool_case(name: str, doc: str | None) -> Any:
    def test(self: ToolCallKits) -> None:
        self._check(name)

    test.__doc__ = doc
    return test


for _name, _fn, _ in _TOOL_CASES:
    setattr(ToolCallKits, f"test_{_name}", _tool_case(_name, _fn.__doc__))


HOSTS = (TextKits, WaitingTimeoutKits, HybridKits, HybridPrefixKits, VLMKits, ToolCallKits)


def _case_names() -> dict[str, str]:
    """``Host.test_x`` -> ``kit::test_x``, the kit named by the module that defines it."""
    names = {}
    for host in HOSTS:
        for attr in dir(host):
            if not attr.startswith("test"):
                continue
            if host is ToolCallKits:
                kit = "tool_call_test_runner"
                case = attr.removeprefix("test_")
            else:
                owner = next(c for c in host.__mro__ if attr in vars(c))
                kit = owner.__module__.rsplit(".", 1)[-1]
                case = attr
            names[f"{host.__name__}.{attr}"] = f"{kit}::{case}"
    return names


(WORK / "cases.json").write_text(json.dumps(_case_names(), indent=1))
