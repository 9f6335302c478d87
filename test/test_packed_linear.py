"""Packed bfloat16 weights (oneDNN's, or the native GEMM's on AVX512-BF16 without AMX): the
encoders' (held once) and the language model's copies for prompt rows; same products."""

from __future__ import annotations

import pytest
import torch
from conftest import NATIVE_GEMM_EXPECTED, examples
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from sglang.srt.kernels import ops
from sglang.srt.layers.quantization import packed_linear

needs_mkldnn = pytest.mark.skipif(
    not packed_linear.available(), reason="no bfloat16 packing here (oneDNN bf16 or native GEMM)"
)

GEMM = ops.native_gemm()
needs_native_gemm = pytest.mark.skipif(
    not NATIVE_GEMM_EXPECTED,
    reason="the native GEMM serves CPUs with AVX512-BF16 and no AMX, built by a C++ compiler",
)


def packed_size(module: nn.Linear) -> int:
    """Bytes of the module's packed weight: the native GEMM's pads the columns to panels."""
    out_features, in_features = module.weight.shape
    if module.packed_gemm is not None:
        out_features = -(-out_features // 64) * 64
    return out_features * in_features * 2


@needs_mkldnn
@settings(max_examples=examples(25), deadline=None)
@given(
    rows=st.sampled_from([1, 3, 17, 64, 300]),
    features=st.sampled_from([(32, 16), (80, 200), (128, 384)]),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_packed_product_equals_torch_linear(rows, features, bias, seed) -> None:
    torch.manual_seed(seed)
    in_features, out_features = features
    linear = nn.Linear(in_features, out_features, bias=bias).to(torch.bfloat16)
    reference = nn.Linear(in_features, out_features, bias=bias).to(torch.bfloat16)
    reference.load_state_dict(linear.state_dict())
    x = torch.randn(2, rows, in_features).to(torch.bfloat16)
    assert packed_linear.install([linear]) == 1
    got, torch_out = linear(x).double(), reference(x).double()
    w, b = reference.weight.double(), reference.bias
    want = x.double() @ w.t() + (b.double() if bias else 0)
    scale = x.double().abs() @ w.abs().t() + (b.double().abs() if bias else 0) + 1e-3
    # float32 accumulation, then one bfloat16 rounding, as torch's own product
    assert ((got - want).abs() / scale).max() < 2**-8
    assert ((got - torch_out).abs() / scale).max() < 2**-7
    # the checkpoint weight's storage is released; shape, dtype and device stay for HF code
    weight = linear.weight
    assert weight.shape == (out_features, in_features) and weight.dtype == torch.bfloat16
    assert weight.device.type == "cpu" and weight.untyped_storage().nbytes() == 2
    assert packed_linear.packed_bytes(linear) == packed_size(linear)
    assert packed_linear.install([linear]) == 0  # packed once


@needs_mkldnn
def test_only_plain_bfloat16_linears_are_packed() -> None:
    fp32 = nn.Linear(16, 8)
    other = nn.Conv1d(4, 4, 1).to(torch.bfloat16)
    assert packed_linear.install([fp32, other]) == 0
    assert fp32.weight.untyped_storage().nbytes() == 16 * 8 * 4


@needs_mkldnn
@settings(max_examples=examples(25), deadline=None)
@given(
    rows=st.sampled_from([1, 5, 16, 17, 40, 300]),
    leading=st.sampled_from([(), (1,)]),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_packed_copy_serves_prompt_rows_and_keeps_the_plain_weight(
    rows, leading, bias, seed
) -> None:
    """A language-model linear with a packed copy runs inputs of more than ``MAX_ROWS`` rows on
    the copy and smaller ones on the plain weight, which it keeps."""
    from sglang.srt.layers.quantization import decode_linear

    torch.manual_seed(seed)
    linear = nn.Linear(64, 48, bias=bias).to(torch.bfloat16)
    decode_linear.install([linear])
    assert packed_linear.add_packed_copies([linear]) == 1
    assert packed_linear.add_packed_copies([linear]) == 0  # one copy
    assert linear.weight.untyped_storage().nbytes() == 64 * 48 * 2
    assert packed_linear.packed_bytes(linear) == packed_size(linear)
    # Route check: the copy is made of twice the weight, so the rows it serves come out doubled.
    doubled = nn.Linear(64, 48, bias=False).to(torch.bfloat16)
    doubled.weight.data.copy_(linear.weight.detach() * 2)
    packed_linear.add_packed_copies([doubled])
    linear.packed_weight = doubled.packed_weight
    x = torch.randn(*leading, rows, 64).to(torch.bfloat16)
    got = linear(x).double()
    w, b = linear.weight.double(), (linear.bias.double() if bias else 0)
    factor = 2 if rows > decode_linear.MAX_ROWS else 1
    want = factor * (x.double() @ w.t()) + b
    scale = factor * (x.double().abs() @ w.abs().t()) + abs(b) + 1e-3
    assert got.shape == (*leading, rows, 48)
    assert ((got - want).abs() / scale).max() < 2**-7


@needs_mkldnn
def test_native_only_install_packs_what_the_native_gemm_takes() -> None:
    """The language model's single layout: packed (and its forward the GEMM's) only where the
    native GEMM takes the weight; elsewhere the plain weight stays for the decode kernel."""
    even, odd = (nn.Linear(k, 24).to(torch.bfloat16) for k in (32, 33))
    assert packed_linear.install([even, odd], native_only=True) == int(NATIVE_GEMM_EXPECTED)
    assert packed_linear.holds_only_packed(even) == NATIVE_GEMM_EXPECTED
    assert not packed_linear.holds_only_packed(odd)
    assert odd.weight.untyped_storage().nbytes() == 33 * 24 * 2


@needs_native_gemm
def test_tied_embedding_reads_its_rows_from_the_head_panels() -> None:
    """Every id's row, looked up in the head's packed panels, is the table's row bit for bit
    (ids in the last, zero-padded panel too); an embedding that does not share the head's
    weight keeps its own lookups."""
    torch.manual_seed(0)
    embed = nn.Embedding(200, 48).to(torch.bfloat16)
    head = nn.Linear(48, 200, bias=False).to(torch.bfloat16)
    head.weight = embed.weight
    table = embed.weight.detach().clone()
    other = nn.Embedding(200, 48).to(torch.bfloat16)
    assert packed_linear.install([head], native_only=True) == 1
    assert not packed_linear.serve_lookups_from_head(other, head)
    assert packed_linear.serve_lookups_from_head(embed, head)
    ids = torch.tensor([[0, 5, 63, 64, 199], [130, 7, 7, 128, 191]])
    assert torch.equal(embed(ids), table[ids])
    assert torch.equal(embed(torch.arange(200)), table)
    x = torch.randn(3, 48).to(torch.bfloat16)
    want = x.double() @ table.double().t()
    scale = x.double().abs() @ table.double().abs().t()
    assert ((head(x).double() - want).abs() <= 2**-7 * scale).all()


@needs_mkldnn
@pytest.mark.parametrize(
    ("family", "lm_weights"),
    [("qwen2_vl", "auto"), ("qwen2_vl", "off"), ("qwen2_vl", "on"), ("paddleocr_vl", "auto")],
)
def test_bf16_engine_holds_each_weight_once_and_counts_its_bytes(
    family: str, lm_weights: str
) -> None:
    """Every linear outside the language model and its head is packed. The language model's
    linears and the head hold one layout: packed only where the native GEMM serves (prompt
    chunks and decode rows alike), else their plain weight (``on`` adds a packed copy beside
    it); ``off`` keeps every plain weight. A head tied to the embeddings (paddleocr_vl) is
    packed too, and the embeddings read its panels. The memory report's weight bytes count
    every packed weight."""
    from conftest import model_dir

    import sglang
    from sglang.srt.model_executor import host_memory

    engine = sglang.Engine(
        model_path=model_dir(family), dtype="bfloat16", cpu_packed_lm_weights=lm_weights
    )
    runner = engine.runner
    head = runner.model.get_output_embeddings()
    tied = head.weight is runner.model.get_input_embeddings().weight
    assert tied == (family == "paddleocr_vl")
    lm = [m for m in runner.adapter.language_model.modules() if isinstance(m, nn.Linear)]
    single = NATIVE_GEMM_EXPECTED and lm_weights != "off"
    assert all(packed_linear.holds_only_packed(m) == single for m in lm)
    assert packed_linear.holds_only_packed(head) == single
    embed = runner.model.get_input_embeddings()
    assert hasattr(embed, "packed_table") == (single and tied)
    plain = [m for m in lm + [head] if not packed_linear.holds_only_packed(m)]
    assert all(m.weight.untyped_storage().nbytes() == m.weight.numel() * 2 for m in plain)
    copied = [m for m in plain if hasattr(m, "packed_weight")]
    assert copied == ([m for m in plain if m is not head] if lm_weights == "on" else [])
    in_lm = {id(m) for m in lm + [head]}
    encoder = [m for m in runner.model.modules() if type(m) is nn.Linear and id(m) not in in_lm]
    assert encoder and all(packed_linear.holds_only_packed(m) for m in encoder)
    packed = packed_linear.packed_bytes(runner.model)
    single_bytes = [m for m in lm + [head] if packed_linear.holds_only_packed(m)]
    assert packed == sum(packed_size(m) for m in encoder + copied + single_bytes)
    assert runner.weights_bytes == host_memory.module_bytes(runner.model) + packed
    copy_bytes = engine.get_server_info()["memory"]["lm_packed_copy_bytes"]
    assert copy_bytes == sum(packed_size(m) for m in copied)
    assert all((m.packed_gemm is not None) == NATIVE_GEMM_EXPECTED for m in encoder)
    out = engine.generate("Describe the weather.", {"temperature": 0, "max_new_tokens": 4})
    assert len(out["output_ids"]) == 4
    engine.shutdown()


@needs_native_gemm
@settings(max_examples=examples(60), deadline=None)
@given(
    rows=st.integers(1, 120),
    in_pairs=st.integers(1, 700),
    out_features=st.integers(1, 200),
    bias=st.booleans(),
    row_stride_extra=st.sampled_from([0, 6]),
    seed=st.integers(0, 2**16),
)
def test_native_gemm_is_the_product_within_bfloat16_rounding(
    rows, in_pairs, out_features, bias, row_stride_extra, seed
) -> None:
    """Any row count (tiles of 7 and their tails, blocks of 98), column count (panels of 64 and
    a masked last one), even input size, strided rows: one bfloat16 rounding of the float32 sum
    from the exact product."""
    torch.manual_seed(seed)
    in_features = 2 * in_pairs
    weight = torch.randn(out_features, in_features).to(torch.bfloat16)
    b = torch.randn(out_features).to(torch.bfloat16) if bias else None
    wide = torch.randn(rows, in_features + row_stride_extra).to(torch.bfloat16)
    x = wide[:, :in_features]
    got = GEMM.linear(x, GEMM.pack(weight), b, out_features).double()
    want = x.double() @ weight.double().t() + (b.double() if bias else 0)
    scale = x.double().abs() @ weight.double().abs().t() + (b.double().abs() if bias else 0)
    # float32 accumulation over the input: |error| <= n u sum |terms|, n the pairs, then one
    # bfloat16 rounding of the result
    accumulation = in_pairs * 2**-24 * scale
    assert ((got - want).abs() <= 2**-8 * want.abs() + 1.01 * accumulation + 1e-30).all()


@needs_native_gemm
def test_native_gemm_rows_do_not_depend_on_the_batch() -> None:
    """A row's output is the same bits alone, in any block position and at any thread count;
    1,100 inputs are three of the spans a decode batch takes a panel by."""
    torch.manual_seed(0)
    weight = torch.randn(200, 1100).to(torch.bfloat16)
    packed = GEMM.pack(weight)
    x = torch.randn(150, 1100).to(torch.bfloat16)
    whole = GEMM.linear(x, packed, None, 200)
    for row in (0, 6, 7, 97, 98, 149):
        alone = GEMM.linear(x[row : row + 1], packed, None, 200)
        assert torch.equal(alone[0], whole[row])
    for rows in (8, 20, 98):  # decode batches: several tiles over the panel block by block
        assert torch.equal(GEMM.linear(x[:rows], packed, None, 200), whole[:rows])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(GEMM.linear(x, packed, None, 200), whole)
    finally:
        torch.set_num_threads(threads)


@needs_native_gemm
def test_native_gemm_rejects_what_it_cannot_take() -> None:
    with pytest.raises(RuntimeError, match="even"):
        GEMM.pack(torch.zeros(8, 5, dtype=torch.bfloat16))
    packed = GEMM.pack(torch.zeros(8, 6, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="disagree"):
        GEMM.linear(torch.zeros(3, 8, dtype=torch.bfloat16), packed, None, 8)
    with pytest.raises(RuntimeError, match="disagree"):
        GEMM.linear(torch.zeros(3, 6, dtype=torch.bfloat16), packed, None, 65)
    odd = nn.Linear(5, 8).to(torch.bfloat16)  # odd input size: oneDNN's packing
    assert packed_linear.install([odd]) == 1 and odd.packed_gemm is None


class _ReferencePanels:
    """gemm_bf16's panel layout in torch: (N, K) -> (ceil(N / 64), K / 2, 64, 2), zero-padded."""

    @staticmethod
    def pack(weight: torch.Tensor) -> torch.Tensor:
        rows, cols = weight.shape
        padded = torch.zeros(-(-rows // 64) * 64, cols, dtype=weight.dtype)
        padded[:rows] = weight
        return padded.view(-1, 64, cols // 2, 2).transpose(1, 2).contiguous()


def _resident_anon_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon")


@pytest.mark.parametrize("rows", [1000, 1024, 1100])
def test_a_consumed_weight_is_packed_slice_by_slice_and_given_back(rows, monkeypatch) -> None:
    """``pack_panels(consume=True)``: the same panels as packing the weight whole (a last
    slice of a partial panel included), and as each slice is packed its pages go back to the
    system (the process's anonymous memory shrinks by the slice then and there), so the weight
    and its panels are never both whole in memory; without ``consume`` nothing goes."""
    from sglang.srt.layers import page_release

    cols = 8192  # 16 KiB a row: 64-row panels of 1 MiB, slices of 4 panels (4 MiB)
    weight = torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows))
    weight = weight.to(torch.bfloat16)
    want = _ReferencePanels.pack(weight)
    assert torch.equal(packed_linear.pack_panels(_ReferencePanels, weight), want)
    assert torch.equal(_ReferencePanels.pack(weight), want)  # left as it was
    source = weight.clone()
    freed = []
    drop = page_release.drop_pages

    def measured(tensor: torch.Tensor) -> bool:
        before = _resident_anon_mb()
        done = drop(tensor)
        freed.append(before - _resident_anon_mb())
        return done

    monkeypatch.setattr(page_release, "drop_pages", measured)
    got = packed_linear.pack_panels(_ReferencePanels, source, consume=True, slice_bytes=4 << 20)
    assert torch.equal(got, want)
    slices = [min(256, rows - first) * cols * 2 / 2**20 for first in range(0, rows, 256)]
    assert len(freed) == len(slices)
    assert all(f > size - 0.1 for f, size in zip(freed, slices)), (freed, slices)
    assert source[300:500].abs().max() == 0  # inside a slice: anonymous pages read back as 0
