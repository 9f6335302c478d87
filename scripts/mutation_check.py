"""Deliberate errors in the engine's core, each of which the suite must catch.

Each mutation replaces a few lines of the source, runs the tests that guard that part, and
restores the file whatever happens; a mutation is caught when those tests fail. The tests are
first run on the unchanged source: a mutation counts only against tests that pass without it.
Not part of CI (about 5 minutes on 2 cores).

    python scripts/mutation_check.py                 # all of them; a table at the end
    python scripts/mutation_check.py --only rope     # names containing "rope"
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "python" / "sglang" / "srt"


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str  # under python/sglang/srt
    edits: tuple[tuple[str, str], ...]  # (text, its replacement); each text occurs once
    tests: tuple[str, ...]  # pytest arguments (files, -k expressions)


MUTATIONS = [
    Mutation(
        "off-by-one chunk boundary (the chunk's last token never gets its image row)",
        "multimodal/embedder.py",
        (
            (
                "lo, hi = prefix_lens[i], prefix_lens[i] + extend_lens[i]",
                "lo, hi = prefix_lens[i], prefix_lens[i] + extend_lens[i] - 1",
            ),
        ),
        ("test/test_parity.py", "-k", "chunk_sizes"),
    ),
    Mutation(
        "dropped image (the last image of a step is not merged)",
        "multimodal/embedder.py",
        (
            (
                "chunks = self._get_chunked_embedding_by_item(reqs, prefix_lens, extend_lens)\n",
                "chunks = self._get_chunked_embedding_by_item(reqs, prefix_lens, extend_lens)"
                "[:-1]\n",
            ),
        ),
        ("test/test_parity.py", "-k", "chunk_sizes"),
    ),
    Mutation(
        "swapped cache key (an image looked up under the step's first image's key)",
        "multimodal/embedder.py",
        (
            (
                "entry = self.cache.get(item.hash, item.num_tokens) if",
                "entry = self.cache.get(needed[0][2].hash, item.num_tokens) if",
            ),
        ),
        ("test/test_vit_cache.py", "test/test_parity.py", "-k", "chunk_sizes or cache"),
    ),
    Mutation(
        "causal mask shifted by one (each query sees the next key)",
        "layers/attention/torch_native.py",
        (("allowed = kv_pos <= q_pos\n", "allowed = kv_pos <= q_pos + 1\n"),),
        ("test/test_attention.py",),
    ),
    Mutation(
        "wrong sliding window (one key too many)",
        "layers/attention/torch_native.py",
        (
            (
                "allowed = (allowed | both_ways) & (kv_pos > q_pos - sliding_window)",
                "allowed = (allowed | both_ways) & (kv_pos >= q_pos - sliding_window)",
            ),
        ),
        ("test/test_attention.py",),
    ),
    Mutation(
        "a kernel's key skipped (key 0 of queries past position 255, native prefill kernel)",
        "kernels/csrc/prefill_attention.cpp",
        (
            (
                "const int64_t j0 = std::max<int64_t>(first_visible(pos, pb.window) - key0, 0);",
                "const int64_t j0 = std::max<int64_t>(first_visible(pos, pb.window) - key0"
                " + (pos >= 256 && key0 == 0), 0);",
            ),
        ),
        ("test/test_prefill_attention.py", "test/test_vision_attention.py"),
    ),
    Mutation(
        "stale embedding reused across models (one embedding cache for every engine)",
        "mem_cache/mm_embedding_cache.py",
        (
            (
                "class MultimodalEmbeddingCache:\n",
                "_SHARED: OrderedDict = OrderedDict()\n\n\nclass MultimodalEmbeddingCache:\n",
            ),
            (
                "self._entries: OrderedDict[int, CachedEmbedding] = OrderedDict()",
                "self._entries: OrderedDict[int, CachedEmbedding] = _SHARED",
            ),
        ),
        ("test/test_parity.py", "-k", "chunk_sizes"),
    ),
    Mutation(
        "frame groups swapped (each group takes the frames of the group mirrored)",
        "multimodal/frame_groups.py",
        (
            (
                "frames = video.source[g * frames_per_group : (g + 1) * frames_per_group]",
                "frames = video.source[(count - 1 - g) * frames_per_group :"
                " (count - g) * frames_per_group]",
            ),
        ),
        ("test/test_video_families.py", "-k", "chunks or whole_prompt"),
    ),
    Mutation(
        "wrong rope delta (M-RoPE positions after the prompt off by one)",
        "core/req.py",
        (
            (
                "tail = torch.arange(max(start, n_in), end) + self.mrope_delta",
                "tail = torch.arange(max(start, n_in), end) + self.mrope_delta + 1",
            ),
        ),
        ("test/test_parity.py", "-k", "chunk_sizes"),
    ),
    Mutation(
        "leaked KV slot (one slot per finished request never freed)",
        "managers/prefill_planner.py",
        (
            (
                "self.kv_pool.free(slots[req.cached_len : dup])",
                "self.kv_pool.free(slots[req.cached_len + 1 : dup])",
            ),
        ),
        ("test/test_parity.py", "-k", "chunk_sizes"),
    ),
    Mutation(
        "detokenizer hold-back off (text that may start a stop string is streamed)",
        "managers/detokenizer.py",
        (("self.hold = max((len(s) for s in params.stop or []), default=1) - 1", "self.hold = 0"),),
        ("test/test_detokenizer.py", "test/test_stop_strings.py"),
    ),
    Mutation(
        "int4 zero point dropped (every group's min set to 0 by the native quantizer)",
        "layers/quantization/quant_layouts.py",
        (("    return codes, scale, low\n", "    return codes, scale, torch.zeros_like(low)\n"),),
        ("test/test_quantized_linear.py",),
    ),
    Mutation(
        "a linear's method attached but its forward left as nn.Linear's (packed weights unread)",
        "layers/quantization/base.py",
        (("    layer.forward = types.MethodType(_forward, layer)\n", ""),),
        ("test/test_linear_methods.py",),
    ),
]


def run_tests(args: tuple[str, ...], timeout: float) -> tuple[bool, str, float]:
    """(passed, the first failure's name or the tail of the output, seconds)."""
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *args]
    env = dict(os.environ, SGLANG_REQUIRE_CPU_KERNELS="1")
    started = time.perf_counter()
    try:
        done = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return False, "timed out", time.perf_counter() - started
    seconds = time.perf_counter() - started
    lines = done.stdout.splitlines()
    failed = [line.split(" - ")[0] for line in lines if line.startswith(("FAILED", "ERROR"))]
    return done.returncode == 0, (failed[0] if failed else (lines[-1] if lines else "")), seconds


def apply(mutation: Mutation) -> str:
    """Edit the source; return its original text."""
    path = SRC / mutation.file
    original = path.read_text()
    text = original
    for old, new in mutation.edits:
        if text.count(old) != 1:
            raise RuntimeError(f"{mutation.name}: the text to replace occurs {text.count(old)}x")
        text = text.replace(old, new)
    path.write_text(text)
    return original


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", help="run the mutations whose name contains this")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args(argv)
    chosen = [m for m in MUTATIONS if args.only in m.name]
    baseline: dict[tuple[str, ...], bool] = {}
    for tests in dict.fromkeys(m.tests for m in chosen):
        passed, detail, seconds = run_tests(tests, args.timeout)
        baseline[tests] = passed
        print(f"baseline {' '.join(tests)}: {'passes' if passed else detail} ({seconds:.0f} s)")
    rows = []
    for mutation in chosen:
        if not baseline[mutation.tests]:
            rows.append({"mutation": mutation.name, "caught": None, "by": "baseline fails"})
            continue
        original = apply(mutation)
        try:
            passed, detail, seconds = run_tests(mutation.tests, args.timeout)
        finally:
            (SRC / mutation.file).write_text(original)
        rows.append({"mutation": mutation.name, "caught": not passed, "by": detail,
                     "seconds": round(seconds)})  # fmt: skip
        print(f"{'caught' if not passed else 'MISSED'}: {mutation.name}: {detail}", flush=True)
    print("\n| mutation | caught | first failing test |\n|---|---|---|")
    for row in rows:
        print(f"| {row['mutation']} | {row['caught']} | {row['by']} |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()
