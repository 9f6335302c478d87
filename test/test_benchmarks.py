"""Benchmarks: smoke runs of every benchmark at tiny settings (their pieces that need no server:
``test_benchmark_units.py``)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

pytest.importorskip("httpx")
pytest.importorskip("tqdm")


HAS_SERVER = importlib.util.find_spec("sglang.launch_server") is not None
needs_server = pytest.mark.skipif(not HAS_SERVER, reason="sglang.launch_server not available")
needs_plots = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason="matplotlib not installed"
)


def _isa_as_cpuinfo_says(isa: dict[str, bool]) -> bool:
    """The benchmark's ISA record (from lscpu) against /proc/cpuinfo's flags."""
    from sglang.srt import kernels

    flags = kernels.cpu_flags()
    return bool(isa) and all(have == (flag in flags) for flag, have in isa.items())


# Smoke runs (tiny model, tiny settings) ----------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from sglang_dev.tiny_models import build_tiny_model

    return str(build_tiny_model("qwen2_5_vl", tmp_path_factory.mktemp("bench") / "qwen2_5_vl"))


def _load(path: Path) -> dict:
    return json.loads(path.with_suffix(".json").read_text())


@needs_plots
def test_embed_corpus_encodes_each_image_once_with_the_cache(tmp_path: Path) -> None:
    """Two passes over the corpus: one encode per image with the cache, two without."""
    from benchmark.embed_corpus import main

    out = tmp_path / "embed"
    main(["--images", "3", "--resolution", "64x64", "--out", str(out)])
    modes = {r["cache"]: r for r in _load(out)["modes"]}
    assert modes["on"]["encodes_per_image"] == 1.0 and modes["off"]["encodes_per_image"] == 2.0
    assert modes["on"]["embeddings"] == 6 and out.with_suffix(".png").is_file()


@needs_plots
def test_video_chat_smoke(tiny_model: str, tmp_path: Path) -> None:
    """Turn 2 onwards encodes nothing; with chunks of 16 tokens, per-group encoding keeps each
    encoder call within a chunk's frame groups while whole-video encoding takes a clip at once."""
    from benchmark.video_chat import main

    out = tmp_path / "video"
    main(["--model-path", tiny_model, "--rounds", "3", "--chat-seconds", "4",
          "--lengths", "4,8", "--chunk", "16", "--out", str(out)])  # fmt: skip
    data = _load(out)
    assert [r["encoded_tokens"] > 0 for r in data["chat"]] == [True, False, False]
    long = {(r["mode"], r["clip_s"]): r for r in data["long"]}
    assert long[("whole", 8.0)]["max_call_tokens"] == long[("whole", 8.0)]["encoded_tokens"]
    assert long[("per-group", 8.0)]["max_call_tokens"] <= 32  # two groups of 16 rows at most
    assert long[("per-group", 8.0)]["encoded_tokens"] == long[("whole", 8.0)]["encoded_tokens"]
    assert out.with_suffix(".png").is_file()


@needs_server
@needs_plots
@pytest.mark.parametrize("interleave", [False, True])
def test_multiturn_image_smoke(tiny_model: str, tmp_path: Path, interleave: bool) -> None:
    """Both cache modes' servers, one after the other or (--interleave) both up, taking the
    rounds in turn; each keeps its own conversation and cache."""
    from benchmark.multiturn_image import main

    out = tmp_path / "mt"
    main(["--model-path", tiny_model, "--resolutions", "64x64", "--rounds", "3",
          "--max-tokens", "4", "--modes", "per-image,combined", "--out", str(out)]
         + (["--interleave"] if interleave else ["--no-probe"]))  # fmt: skip
    data = _load(out)
    assert [run["label"] for run in data["runs"]] == ["ours:per-image", "ours:combined"]
    assert data["config"]["interleaved"] is interleave
    others = [r.get("others_cpu_s") for run in data["runs"] for r in run["rounds"]]
    # the idle server is stopped while the other plays a round
    assert all(x is not None and 0 <= x < 0.05 for x in others) if interleave else not any(others)
    for run in data["runs"]:
        assert [r["round"] for r in run["rounds"]] == [0, 1, 2]
        for r in run["rounds"]:
            assert r["ttft_ms"] > 0 and r["prompt_tokens"] > 0
            assert r["cached_tokens"] is not None and 0 <= r["hit_rate"] <= 1
        assert run["rounds"][2]["cached_tokens"] > 0  # the conversation prefix is reused
    per_image, combined = (run["rounds"] for run in data["runs"])
    assert [r["encoded_items"] for r in per_image] == [1, 1, 1]
    assert [r["encoded_items"] for r in combined] == [1, 2, 3]
    assert data["goals"]["64x64"]["per_image_one_item_per_round"] is True
    assert out.with_suffix(".png").stat().st_size > 0 and out.with_suffix(".md").exists()
    config = data["config"]
    assert config["cpu"]["model_name"] and _isa_as_cpuinfo_says(config["cpu"]["isa"])
    for r in per_image:  # where the round's time went
        parts = ("api_other_ms", "preprocess_ms", "vision_ms", "lm_ms", "sampling_ms")
        assert all(r[k] >= 0 for k in parts)
        assert sum(r[k] for k in parts) == pytest.approx(r["ttft_ms"], rel=0.05)
    if not interleave:  # --no-probe: no peak or bandwidth to count against (5 s of probes)
        assert config["matmul_peak"] is None and config["memory_bandwidth"] is None
        return
    assert config["matmul_peak"]["gflop_per_s"] > 0 and config["memory_bandwidth"]["gb_per_s"] > 0
    for r in per_image:  # the round's work and its MFU, in all and per part
        assert r["round_gflops"] > 0 and 0 < r["mfu"] < 1
        assert r["vision_attention_ms"] > 0 and r["vision_dense_ms"] > 0
        assert r["vision_attention_ms"] + r["vision_dense_ms"] == pytest.approx(r["vision_ms"])
        assert 0 < r["vision_attention_of_peak"] < 1 and 0 < r["lm_dense_of_peak"] < 1
        # float32 here: every part counts against the one peak, as the round's MFU does
        assert r["mfu_at_part_peaks"] == pytest.approx(r["mfu"])
        assert r["decode_ms_per_step"] > 0 and 0 < r["decode_of_bandwidth"] < 1
    assert "MFU at part peaks" in out.with_suffix(".md").read_text()


@needs_server
@needs_plots
def test_multiturn_image_smoke_on_qwen3_5(tmp_path: Path) -> None:
    """The hybrid model resumes every later round from a state snapshot; thinking off."""
    from benchmark.multiturn_image import main
    from sglang_dev.tiny_models import build_tiny_model

    model = build_tiny_model("qwen3_5", tmp_path / "qwen3_5")
    out = tmp_path / "mt35"
    main(["--model-path", str(model), "--resolutions", "64x64", "--rounds", "3",
          "--max-tokens", "4", "--modes", "per-image", "--think-mode", "qwen3",
          "--out", str(out)])  # fmt: skip
    (run,) = _load(out)["runs"]
    assert [r["encoded_items"] for r in run["rounds"]] == [1, 1, 1]
    assert [r["cached_tokens"] > 0 for r in run["rounds"]] == [False, True, True]


@needs_plots
def test_vit_per_chunk_smoke(tiny_model: str, tmp_path: Path) -> None:
    from benchmark.vit_per_chunk import main

    out = tmp_path / "vpc"
    main(["--model-path", tiny_model, "--images", "3", "--resolution", "96x96",
          "--chunk", "32", "--out", str(out)])  # fmt: skip
    data = _load(out)
    by_mode = {r["mode"]: r["passes"] for r in data["results"]}
    assert set(by_mode) == {"per-image", "combined", "off"}
    for mode, (cold, warm) in by_mode.items():
        cold_items = sum(c["encoded_items"] for c in cold["chunks"])
        warm_items = sum(c["encoded_items"] for c in warm["chunks"])
        if mode == "off":  # nothing cached: an image split over two chunks is encoded twice
            assert cold_items == warm_items > 3
        else:
            assert (cold_items, warm_items) == (3, 0)
    assert by_mode["combined"][0]["max_items_per_chunk"] == 3  # chunk 1 encodes all
    assert by_mode["per-image"][0]["max_items_per_chunk"] < 3


@needs_server
@needs_plots
def test_image_limit_smoke(tiny_model: str, tmp_path: Path) -> None:
    from benchmark.image_limit import main

    out = tmp_path / "il"
    main(["--model-path", tiny_model, "--resolution", "64x64", "--cap", "3",
          "--chunk", "64", "--modes", "per-image", "--out", str(out)])  # fmt: skip
    steps = _load(out)["results"][0]["steps"]
    assert [s["images"] for s in steps] == [1, 2, 3]
    assert all(s["ok"] and s["ttft_ms"] > 0 and s["peak_mb"] > 0 for s in steps)


@needs_plots
def test_image_limit_offline_stops_at_failure(tiny_model: str, tmp_path: Path) -> None:
    """A context of 1000 tokens fits 11 images of 81 tokens (85 with their markers and word):
    the probe stops at 12."""
    from benchmark.image_limit import main

    out = tmp_path / "ilo"
    main(["--model-path", tiny_model, "--resolution", "256x256", "--cap", "30", "--chunk",
          "4096", "--modes", "per-image", "--offline", "--context-length", "1000",
          "--out", str(out)])  # fmt: skip
    result = _load(out)["results"][0]
    assert result["max_ok_images"] == 11 and len(result["steps"]) == 12
    assert not result["steps"][-1]["ok"] and "context length" in result["steps"][-1]["error"]


@needs_server
@needs_plots
def test_serving_throughput_smoke(tiny_model: str, tmp_path: Path) -> None:
    from benchmark.serving_throughput import main

    out = tmp_path / "tp"
    main(["--model-path", tiny_model, "--num-prompts", "6", "--resolution", "64x64",
          "--max-concurrency", "3", "--output-len", "4", "--modes", "per-image",
          "--out", str(out)])  # fmt: skip
    (run,) = _load(out)["runs"]
    assert run["completed"] == 6 and run["failed"] == 0
    assert run["request_throughput"] > 0 and run["ttft_ms"]["n"] == 6
    assert run["ttft_ms"]["median"] <= run["ttft_ms"]["p99"]
    assert run["tpot_ms"]["n"] == 6  # ignore_eos: every request produced 4 tokens


@needs_server
def test_ocrbench_same_accuracy_in_every_mode(tiny_model: str, tmp_path: Path) -> None:
    from benchmark.ocrbench import main
    from benchmark.ocrbench_synth import generate

    data = generate(tmp_path / "ocr", count=12)
    out = tmp_path / "ocr-report"
    # two of the three cache modes (test_ocr_reader compares all three on the trained reader)
    main(["--data", str(data), "--model-path", tiny_model, "--max-tokens", "8",
          "--concurrency", "4", "--modes", "per-image,off", "--out", str(out)])  # fmt: skip
    reports = _load(out)["reports"]
    assert [r["label"] for r in reports] == ["ours:per-image", "ours:off"]
    assert all(r["errors"] == 0 and r["total"] == 12 for r in reports)
    assert len({r["correct"] for r in reports}) == 1
    predictions = [[p["prediction"] for p in r["predictions"]] for r in reports]
    assert predictions[0] == predictions[1]  # greedy: identical outputs


def test_constraint_cost_smoke(tiny_model: str, tmp_path: Path) -> None:
    from benchmark.constraint_cost import main

    out = tmp_path / "cc"
    main(["--model-path", tiny_model, "--batches", "1,2", "--steps", "4", "--repeats", "1",
          "--out", str(out)])  # fmt: skip
    data = _load(out)
    assert [r["batch"] for r in data["results"]] == [1, 2]
    for r in data["results"]:
        assert r["decode_steps"] >= 2 and r["constrained_step_ms"] > 0
        assert r["constraint_ms_median"] > 0 and r["free_constraint_ms_median"] < 1
    assert out.with_suffix(".md").exists()


@needs_server
@needs_plots
def test_memory_smoke(tmp_path: Path) -> None:
    """A Qwen2.5-VL-shaped checkpoint with tiny widths, built in bfloat16 and served (built into
    the test's folder; the native kernels stay in the suite's cache)."""
    from benchmark.lib.shaped_checkpoints import build_checkpoint, shape_config
    from benchmark.memory import main

    model = build_checkpoint(tmp_path / "ckpt", shape_config("tiny", None, None))
    out = tmp_path / "mem"
    main(["--shape", "tiny", "--model-path", str(model), "--settings", "bfloat16,awq",
          "--refuse-dtype", "", "--max-tokens", "8", "--out", str(out)])  # fmt: skip
    data = _load(out)
    run, awq = data["runs"]
    assert [r["server_memory"]["dtype"] for r in (run, awq)] == ["bfloat16", "bfloat16"]
    # the AWQ twin: its own (smaller) checkpoint, served and measured against its size
    assert 0 < awq["checkpoint_bytes"] < run["checkpoint_bytes"]
    assert awq["load_peak_over_checkpoint"] > 0 and awq["request"]["completion_tokens"] == 8
    assert run["rss_after_request"]["peak_mb"] >= run["rss_at_start"]["peak_mb"] > 0
    assert run["request"]["completion_tokens"] == 8 and run["request"]["ttft_s"] > 0
    assert run["request"]["decode_tok_per_s"] > 0
    read = run["decode_read"]
    assert read["bytes_per_step"] > 0 and read["copy_gb_per_s"] > 0
    assert read["of_bandwidth"] == pytest.approx(read["gb_per_s"] / read["copy_gb_per_s"])
    assert data["cpu"]["model_name"] and _isa_as_cpuinfo_says(data["cpu"]["isa"])
    assert out.with_suffix(".png").stat().st_size > 0


def test_detokenize_smoke(tiny_model: str, tmp_path: Path) -> None:
    from benchmark.detokenize import main

    out = tmp_path / "detok"
    main(["--model-path", tiny_model, "--tokens", "300", "--repeats", "1", "--out", str(out)])
    data = _load(out)
    assert {r["method"] for r in data["results"]} == {"whole", "incremental"}
    for r in data["results"]:
        assert len(r["us_per_event"]) == 2 and all(us > 0 for us in r["us_per_event"])
    assert out.with_suffix(".png").exists()


@needs_plots
def test_decode_step_smoke(tmp_path: Path) -> None:
    from benchmark.decode_step import main

    out = tmp_path / "decode"
    main(["--shape", "tiny", "--layers", "1", "--batch-sizes", "1,2", "--repeats", "1",
          "--new-tokens", "3", "--prompt-len", "16", "--out", str(out)])  # fmt: skip
    data = _load(out)
    assert [r["batch"] for r in data["rows"]] == [1, 2]
    for r in data["rows"]:
        assert r["floor_ms"] == max(r["bytes_ms"], r["flops_ms"]) > 0
        assert min(r["packed_ms"], r["plain_ms"], r["torch_ms"]) > 0
    assert data["rows"][0]["packed_x_batch1"] == 1
    assert data["wall_s"] > 0 and out.with_suffix(".png").stat().st_size > 0
    # the served path alone: no plain-weights engine, no torch columns
    main(["--shape", "tiny", "--layers", "1", "--batch-sizes", "2", "--repeats", "1",
          "--new-tokens", "3", "--prompt-len", "16", "--paths", "packed",
          "--out", str(out)])  # fmt: skip
    (row,) = _load(out)["rows"]
    assert row["packed_ms"] > 0 and not any(k.startswith(("plain", "torch")) for k in row)
    assert "torch" not in out.with_suffix(".md").read_text()


def test_fleet_smoke(tiny_model: str, tmp_path: Path) -> None:
    """Two round-robin workers sharing a store and its KV tier: one encode per round across the
    fleet, each round prefilling no more than a sticky worker does (plus a partial page)."""
    from benchmark.fleet import KV_PAGE, main

    out = tmp_path / "fleet"
    main(["--model-path", tiny_model, "--layouts", "store+kv,sticky", "--rounds", "3",
          "--resolution", "64x48", "--max-tokens", "4", "--dtype", "float32",
          "--out", str(out)])  # fmt: skip
    run, sticky = _load(out)["runs"]
    assert [r["encoded"] for r in run["rounds"]] == [1, 1, 1] and run["encoded_total"] == 3
    store = run["store"]
    assert store["saved"] == 3 and store["ms_per_lookup"] > 0
    assert store["hits"] == 0  # the earlier rounds' images come as KV, not as embeddings
    assert run["replies"] == sticky["replies"]
    for fleet_round, sticky_round in zip(run["rounds"][1:], sticky["rounds"][1:]):
        assert fleet_round["prefilled"] <= sticky_round["prefilled"] + KV_PAGE
    assert sum(r["kv"]["tokens_loaded"] for r in run["rounds"]) > 0
    assert "/ sticky" in out.with_suffix(".md").read_text()
    assert out.with_suffix(".png").stat().st_size > 0


@needs_plots
def test_kernels_vs_torch_covers_every_kernel(tmp_path: Path) -> None:
    """Every native kernel the engine takes here is timed against its torch path, both giving
    the same values (the comparison is of one computation), and the report lists the cells
    where the kernel is slower."""
    from benchmark.kernels_vs_torch import cases, main
    from sglang.srt import kernels

    for case in cases("small"):
        torch_out, kernel_out = case.torch_call(), case.kernel_call()
        if not isinstance(torch_out, tuple):
            torch_out, kernel_out = (torch_out,), (kernel_out,)
        pairs = zip(torch_out, kernel_out)
        for want, got in pairs:
            scale = want.float().abs().max().item() + 1
            assert (got.float() - want.float()).abs().max().item() <= 0.05 * scale, case.label
    out = tmp_path / "kvt"
    data = main(["--shape", "small", "--repeats", "1", "--out", str(out)])
    built = {n for n in kernels.kernel_names() if kernels.load(n) is not None}
    timed = {r["kernel"] for r in data["rows"]}
    assert timed | set(data["not_taken"]) == built and not timed & set(data["not_taken"])
    assert all(r["torch_ms"] > 0 and r["kernel_ms"] > 0 for r in data["rows"])
    assert "slower than torch:" in out.with_suffix(".md").read_text()
    assert out.with_suffix(".png").is_file() and out.with_suffix(".json").is_file()
