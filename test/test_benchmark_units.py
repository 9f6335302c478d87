"""The benchmarks' pieces that need no server: OCRBench's scoring rules, the synthetic set's
format, the matmul peak probe, which arithmetic each part of a round is counted against, the
split of a round's forwards, shaped checkpoints' muted ids, the vLLM bench command and the
llama.cpp comparison's report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

pytest.importorskip("httpx")
pytest.importorskip("tqdm")

from benchmark.ocrbench import is_correct, score  # noqa: E402


# OCRBench scoring ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "prediction, answers, ok",
    [
        ("The word is HELLO.", ["hello"], True),  # case-insensitive
        ("  hello\nworld ", "hello world", True),  # newline -> space, string answer
        ("hel lo", ["hello"], False),  # spaces matter outside HME100k
        ("nothing here", ["cat", "dog"], False),
        ("a big Dog", ["cat", "dog"], True),  # any of several answers
        ("", ["x"], False),
    ],
)
def test_normal_rule(prediction: str, answers: list[str] | str, ok: bool) -> None:
    assert is_correct(prediction, answers, "IIIT5K") is ok


@pytest.mark.parametrize(
    "prediction, answers, ok",
    [
        ("x ^ { 2 } + 1", ["x^{2}+1"], True),  # all spaces removed from both sides
        ("x^{2}+1", ["x ^ { 2 } + 1"], True),
        ("X^{2}+1", ["x^{2}+1"], False),  # case-sensitive
        ("= \\frac { a } { b }", ["\\frac{a}{b}"], True),
        ("x^{3}", ["x^{2}"], False),
    ],
)
def test_hme_rule(prediction: str, answers: list[str], ok: bool) -> None:
    assert is_correct(prediction, answers, "HME100k") is ok


def test_score_groups_categories() -> None:
    entries = [
        {"type": "Regular Text Recognition", "dataset_name": "IIIT5K", "answers": ["cat"]},
        {"type": "Regular Text Recognition", "dataset_name": "IIIT5K", "answers": ["dog"]},
        {"type": "Doc-oriented VQA", "dataset_name": "docVQA", "answers": ["Paris"]},
        {
            "type": "Handwritten Mathematical Expression Recognition",
            "dataset_name": "HME100k",
            "answers": ["a+b"],
        },
    ]
    result = score(entries, ["a cat", "a cow", "it is paris", "A + B"])
    assert result["categories"]["Regular Text Recognition"] == {"correct": 1, "total": 2}
    assert result["categories"]["Doc-oriented VQA"] == {"correct": 1, "total": 1}
    hme = result["categories"]["Handwritten Mathematical Expression Recognition"]
    assert hme == {"correct": 0, "total": 1}  # case-sensitive
    assert result["text_recognition"] == {"correct": 1, "total": 2}
    assert (result["correct"], result["total"], result["accuracy"]) == (2, 4, 0.5)


def test_synthetic_set_format(tmp_path: Path) -> None:
    from benchmark.ocrbench import CATEGORIES, load_dataset
    from benchmark.ocrbench_synth import generate

    folder = generate(tmp_path / "ocr", count=20)
    entries = load_dataset(folder)
    assert len(entries) == 20
    assert {e["type"] for e in entries} == set(CATEGORIES)
    for e in entries:
        assert {"dataset_name", "id", "image_path", "question", "answers", "type"} <= e.keys()
        assert Path(e["_image_file"]).is_file()
        assert (e["dataset_name"] == "HME100k") == (e["type"] == CATEGORIES[-1])


def test_matmul_peak_takes_the_faster_product() -> None:
    """In bfloat16 the probe times the engine's own GEMM too where it serves the packed linears,
    so MFU is measured against the faster of the two."""
    from conftest import NATIVE_GEMM_EXPECTED

    from benchmark.lib.hardware import matmul_peak_gflops

    peak = matmul_peak_gflops(size=256, seconds=0.1, dtype="bfloat16")
    rates = [v for k, v in peak.items() if k.endswith("_gflop_per_s")]
    assert peak["gflop_per_s"] == max(rates) > 0 and peak["torch_gflop_per_s"] > 0
    assert ("native_gflop_per_s" in peak) == NATIVE_GEMM_EXPECTED


@pytest.mark.parametrize(
    ("dtype", "server_args", "want"),
    [("float32", "", "float32"), ("bfloat16", "--chunked-prefill-size 64", "bfloat16"),
     ("float32", "--dtype bfloat16", "bfloat16"), ("auto", "--dtype=float32", "float32"),
     ("float32", "--dtype bfloat16 --dtype float16", "float16")],
)  # fmt: skip
def test_multiturn_image_probes_the_dtype_our_server_runs(dtype, server_args, want) -> None:
    """A --dtype among our server's extra flags comes after the benchmark's own and wins: the
    matmul probe that MFU is counted against must take it too."""
    import argparse

    from benchmark.multiturn_image import our_dtype

    assert our_dtype(argparse.Namespace(dtype=dtype, server_args=server_args)) == want


@pytest.mark.parametrize(
    ("dtype", "server_args", "vision_dense", "lm_dense", "attention"),
    [("bfloat16", "", "bfloat16", "bfloat16", "bfloat16"),
     ("float32", "", "float32", "float32", "float32"),
     ("bfloat16", "--torchao-config int8wo", "bfloat16", "bfloat16", "bfloat16"),
     ("bfloat16", "--torchao-config int8dq", "bfloat16", "int8", "bfloat16"),
     ("bfloat16", "--torchao-config int8dq --vision-int8dq", "int8", "int8", "bfloat16"),
     ("bfloat16", "--torchao-config 8da4w-128 --vision-int8dq", "int8", "int8", "bfloat16")],
)  # fmt: skip
def test_multiturn_image_counts_each_part_against_its_arithmetic(
    dtype, server_args, vision_dense, lm_dense, attention
) -> None:
    """Linears that take int8 activations count against the int8 product's peak (the tower's
    only with --vision-int8dq); attention, and weight-only widths, against the compute dtype's."""
    import argparse

    from benchmark.multiturn_image import part_dtypes

    got = part_dtypes(argparse.Namespace(dtype=dtype, server_args=server_args))
    assert got == {"vision_attention": attention, "vision_dense": vision_dense,
                   "lm_attention": attention, "lm_dense": lm_dense}  # fmt: skip


def test_parts_of_round_split_the_forwards_time_and_work() -> None:
    """Attention and the rest, in the tower and in the LM: the four parts' times add up to the
    prefill forwards' time, each rate is its FLOPs over its time, and MFU at part peaks is the
    time at every part's peak over TTFT."""
    from benchmark.lib.counters import parts_of_round

    perf = {
        "vision_seconds": 0.15, "vision_flops": 180e9, "vision_attention_seconds": 0.04,
        "vision_attention_flops": 25e9, "lm_attention_seconds": 0.01, "lm_attention_flops": 3e9,
        "lm_linear_flops": 180e9, "lm_head_flops": 1e9, "prefill_forward_seconds": 0.3,
    }  # fmt: skip
    encoder = {"encoder_seconds": 0.16}  # the tower plus its preprocessing
    peaks = {"vision_attention": 1000.0, "vision_dense": 2000.0, "lm_attention": 1000.0,
             "lm_dense": 2000.0}  # fmt: skip
    out = parts_of_round(perf, encoder, 0.4, peaks)
    ms = {p: out[f"{p}_ms"] for p in peaks}
    assert ms == pytest.approx(
        {"vision_attention": 40, "vision_dense": 110, "lm_attention": 10, "lm_dense": 130}
    )
    assert out["vision_dense_gflop_per_s"] == pytest.approx(155 / 0.11)
    assert out["lm_dense_of_peak"] == pytest.approx(181 / 0.13 / 2000)
    assert out["vision_attention_of_peak"] == pytest.approx(25 / 0.04 / 1000)
    ideal = 25 / 1000 + 155 / 2000 + 3 / 1000 + 181 / 2000  # seconds (GFLOP / GFLOP/s)
    assert out["mfu_at_part_peaks"] == pytest.approx(ideal / 0.4)
    # a part without a probed peak: its rate stands, nothing is counted against a peak
    partial = parts_of_round(perf, encoder, 0.4, {**peaks, "lm_attention": None})
    assert partial["lm_attention_of_peak"] is None and partial["mfu_at_part_peaks"] is None
    assert partial["lm_attention_gflop_per_s"] == pytest.approx(300)
    assert parts_of_round(None, encoder, 0.4, peaks) == {}


def test_quant_linear_counts_each_width_against_its_products_peak(monkeypatch) -> None:
    """Weight-only int8 / int4 multiply in the float product (bfloat16, or float32 without it);
    only int8dq and 8da4w count against the int8 product's peak."""
    import benchmark.quant_linear as quant_linear
    from sglang.srt.model_executor import dtypes

    rates = {"int8": 300.0, "bfloat16": 100.0, "float32": 50.0}
    monkeypatch.setattr(
        quant_linear, "matmul_peak_gflops", lambda dtype: {"gflop_per_s": rates[dtype]}
    )
    for isa, float_peak in (("avx512_bf16", 100.0), (None, 50.0)):
        monkeypatch.setattr(dtypes, "cpu_bfloat16_isa", lambda isa=isa: isa)
        peaks = quant_linear._compute_peaks(["bf16", "int8", "int4-128", "int8dq", "8da4w-128"])
        assert peaks == {"bf16": float_peak, "int8": float_peak, "int4-128": float_peak,
                         "int8dq": 300.0, "8da4w-128": 300.0}  # fmt: skip


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen2_vl"])
def test_shaped_checkpoint_speaks_in_tokenizer_ids(tmp_path: Path, family: str) -> None:
    """Random shaped checkpoints: the head scores 0 for every id the tokenizer lacks, its special
    tokens and pieces that are no text alone (a random model's first token is text: client-timed
    TTFT is the first token's), the config names the generating architecture (peers pick the
    model class from it), tied heads are written once."""
    import transformers
    from safetensors.torch import load_file

    from benchmark.lib.shaped_checkpoints import SHAPES, build_checkpoint, shape_config

    dims = shape_config("tiny", None, None)
    if family == "qwen2_vl":  # the 2B's layout (full-attention tower, tied head), tiny widths
        vision = {**SHAPES["2b"]["vision"], "depth": 1, "embed_dim": 32, "num_heads": 2,
                  "hidden_size": dims["text"]["hidden_size"]}  # fmt: skip
        dims = {"model_type": "qwen2_vl", "text": {**dims["text"], "tie_word_embeddings": True},
                "vision": vision}  # fmt: skip
    out = build_checkpoint(tmp_path / family, dims)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == family
    assert config["architectures"][0].endswith("ForConditionalGeneration")
    tensors: dict = {}
    for shard in out.glob("*.safetensors"):
        tensors.update(load_file(shard))
    heads = [n for n in tensors if n.endswith("lm_head.weight")]
    if family == "qwen2_vl":
        assert not heads  # tied: the embedding is the head
        heads = [n for n in tensors if n.endswith("embed_tokens.weight")]
    (head,) = heads
    tok = transformers.AutoTokenizer.from_pretrained(out)
    rows = tensors[head].float().abs().sum(dim=1)
    assert len(tok) < rows.numel() and (rows[len(tok) :] == 0).all()
    speaks = [i for i in range(len(tok)) if rows[i] > 0]
    assert len(speaks) > len(tok) // 2 and not set(speaks) & set(tok.all_special_ids)
    assert all(tok.decode([i]).strip() and "\ufffd" not in tok.decode([i]) for i in speaks)
    # the muted ones are exactly those: specials and ids with no text of their own
    assert all(i in tok.all_special_ids or not tok.decode([i]).strip()
               or "\ufffd" in tok.decode([i]) for i in range(len(tok)) if rows[i] == 0)  # fmt: skip


def test_bench_serve_command_is_what_vllm_parses() -> None:
    """The random-mm bucket string is the dict vLLM's parser reads (a literal with tuple keys)."""
    import argparse
    import ast

    from benchmark.servers import Server
    from benchmark.vllm_bench_serve import client_command, main  # noqa: F401

    args = argparse.Namespace(image_size=448, model_path="/m", num_prompts=8, max_concurrency=8,
                              input_len=64, output_len=32, images=2)  # fmt: skip
    cmd = client_command(Server("http://127.0.0.1:1", "default", "ours", "ours"), args, 8, 0,
                         Path("/tmp"), "r.json")  # fmt: skip
    flag = dict(zip(cmd[3::1], cmd[4::1]))
    assert ast.literal_eval(flag["--random-mm-bucket-config"]) == {(448, 448, 1): 1.0}
    assert json.loads(flag["--random-mm-limit-mm-per-prompt"]) == {"image": 2, "video": 0}
    assert flag["--model"] == "default" and flag["--num-prompts"] == "8"


# llama.cpp comparison's report -----------------------------------------------------------------
def _chat_round(ttft_ms: float, attention_ms: float | None = None) -> dict:
    parts = {}
    if attention_ms is not None:  # our servers' rounds carry the split, llama-server's do not
        parts = {"vision_attention_ms": attention_ms, "vision_attention_of_peak": 0.5,
                 "vision_dense_ms": 100.0, "vision_dense_of_peak": 0.9, "lm_attention_ms": 5.0,
                 "lm_attention_of_peak": 0.2, "lm_dense_ms": 50.0, "lm_dense_of_peak": 0.8,
                 "mfu_at_part_peaks": 0.7}  # fmt: skip
    return {"ttft_ms": ttft_ms, "prompt_tokens": 400, "cached_tokens": 0, **parts}


def _launch(engine: str, label: str, ttft: dict[str, list[float]], repeat: int) -> dict:
    split = engine == "ours"
    return {
        "engine": engine, "width": "bf16", "label": label, "repeat": repeat, "startup_s": 1.0,
        "rss_ready": {"rss_mb": 1024.0}, "rss_after": {"rss_mb": 2048.0, "anon_mb": 1.0},
        "decode": [{"decode_tok_per_s": 10.0 if engine == "ours" else 5.0}],
        "chats": {res: [_chat_round(t, t / 10 if split else None) for t in times]
                  for res, times in ttft.items()},
    }  # fmt: skip


def test_llamacpp_report_per_resolution_best_rounds_ratios_and_parts(tmp_path: Path) -> None:
    """Per resolution each round's best repeat, ours over llama's mean TTFT, and the part
    split for our rounds only."""
    from benchmark.llamacpp_report import aggregate, markdown, plot, ratios

    runs = [
        _launch("ours", "ours:bf16", {"644x476": [300, 200], "1288x728": [900, 800]}, 0),
        _launch("ours", "ours:bf16", {"644x476": [100, 400], "1288x728": [1000, 600]}, 1),
        _launch("llamacpp", "llama:BF16", {"644x476": [400, 400], "1288x728": [1400, 1400]}, 0),
    ]
    per = aggregate(runs)
    assert per["ours:bf16"]["chat"]["644x476"]["ttft_ms"] == [100, 200]
    assert per["ours:bf16"]["chat"]["1288x728"]["ttft_mean_ms"] == 750
    assert per["ours:bf16"]["chat"]["644x476"]["parts"]["vision_attention_ms"] == 15
    assert per["llama:BF16"]["chat"]["644x476"]["parts"]["vision_attention_ms"] is None
    labels = {"bf16": ("ours:bf16", "llama:BF16")}
    both = ratios(per, labels)
    rat = both["bf16"]
    assert rat["ttft_mean"] == {"644x476": 150 / 400, "1288x728": 750 / 1400}
    assert rat["decode"] == 2.0 and rat["ttft_per_round"]["644x476"] == [0.25, 0.5]
    config = {
        "llama_server_version": "llama-server test",
        "model_path": "m",
        "shape": "2b",
        "layers": 2,
        "vision_depth": 2,
        "dtype": "auto",
        "compute_dtype": "float32",
        "repeats": 2,
        "max_tokens": 8,
        "rounds": 2,
        "labels": labels,
        "resolutions": ["644x476", "1288x728"],
        "peaks_gflop_per_s": {"float32": 100.0},
    }
    cpu = {"model_name": "test", "cores": 2, "isa": {"avx2": True}}
    result = {"cpu": cpu, "config": config, "per_label": per, "ratios": both, "failures": []}
    text = markdown(result)
    assert "TTFT mean ms 1288x728" in text and "15 (0.50)" in text and "float32 100" in text
    parts_rows = [line for line in text.splitlines() if line.startswith("| ours:bf16 | ")]
    assert len(parts_rows) == 3  # the main table's row, then one parts row per resolution
    plot(result, tmp_path / "llamacpp.png")
    assert (tmp_path / "llamacpp.png").stat().st_size > 0
