"""Train the OCR reader: a small Qwen2-VL trained from scratch on rendered text, on a CPU.

The checkpoint it writes is the engine's embedded default (``python/sglang/default_model``),
which the OCRBench tests and benchmark run: a Qwen2-VL architecture (the 14-px ViT with 2 x 2
patch merging, M-RoPE, a ChatML template) whose vision tower and language model are trained
together, with a byte-level BPE tokenizer trained here on the prompts' text so that answers are
spelled almost character by character. Samples are drawn on the fly by ``benchmark.ocr_render``
(its ``train`` split; the held-out split's fonts and sizes are never seen), preprocessed by the
server's own ``fast_preprocess`` (bit-identical to HF's processor), and only the answer's tokens
carry loss.

Everything is seeded: the same command gives the same checkpoint on the same CPU (and the same
accuracy within noise on another).

    python -m benchmark.train_reader            # writes python/sglang/default_model
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from benchmark.ocr_render import CATEGORIES, CELL, GLYPH_CHARS, render, render_string
from sglang_dev.tiny_models.common import (
    QWEN_ROLES,
    QWEN_SPECIALS,
    TokSpec,
    qwen_generation,
    qwen_ids,
    qwen_preprocessor,
    qwen_template,
    qwen_text,
    qwen_video_preprocessor,
    torch_seed,
    train_tokenizer,
    write_json,
)

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "python" / "sglang" / "default_model"
VOCAB_SIZE = 384  # 256 bytes + 128 merges, learnt from the questions: answers stay near one
# character per token, prompts get short
MIN_PIXELS, MAX_PIXELS = 28 * 56, 112 * 336  # 2 to 48 image tokens per image
TEXT_SHAPE = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 4096,
    "initializer_range": 0.02,
    "tie_word_embeddings": True,
}
VISION_SHAPE = {
    "depth": 4,
    "embed_dim": 192,
    "num_heads": 6,
    "mlp_ratio": 4,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "patch_size": 14,
    "initializer_range": 0.02,
}
# The pixel statistics of the rendered text (mostly light backgrounds), not CLIP's: with CLIP's, a
# page's background normalises to about +1.7 in every input of a patch and the strokes are small
# departures from it, and a tower trained from scratch does not get past chance in 1,000 steps.
IMAGE_MEAN = [0.85, 0.85, 0.85]
IMAGE_STD = [0.3, 0.3, 0.3]
# M-RoPE gives its frequencies to the time, height and width axes in that order, highest first. The
# reader's images are one to four rows of up to twelve tokens, and an answer is read out column by
# column: so the width axis gets most of the 16 frequencies of a 32-wide head, and a small theta
# keeps them fast enough to tell neighbouring columns apart (10,000 would turn the width
# frequencies by less than 0.003 radians per column).
ROPE_THETA = 50.0
MROPE_SECTION = [2, 2, 12]
# Training-only supervision of the tower: on every sample whose glyph positions are known (all
# but the formulas), a linear head over each image token names the character centred in each
# quarter of its 28-px cell (or none). The tower learns glyphs from every token instead of only
# through the language model's answer, which is what lets it start reading within minutes; the
# head is dropped before the checkpoint is saved.
SLOTS = 4
AUX_WEIGHT = 1.0  # against the answer's loss (held-out at 3,750 steps: 0.5 -> 0.624, 1.0 -> 0.642)
STRING_SHARE = 0.25  # the share of random strings that stays in every batch after the curriculum
# How often each category is drawn in training (recognition of single lines dominates). Regular
# words at 4 instead of 2: held-out words 0.81 -> 0.86 on 300 questions, 0.68 overall either way.
CATEGORY_WEIGHTS = (4.0, 1.0, 1.0, 1.0, 2.0, 2.0, 1.0, 1.5, 1.5, 1.0)
_TOKENIZER_CORPUS = "\n".join(
    [
        "what is written in the image?",
        "What is written on the sign?",
        "What is the title of this document?",
        "What is written on line 2? What is written on line 3?",
        "What is the total? What is the date? What is the shop? What is the tax?",
        "What is the cash? What is the item? What is the time? What is the tel?",
        "Please write out the expression of the formula in the image using LaTeX format.",
        "user assistant system",
    ]
    * 4
)


def build_tokenizer() -> Any:
    spec = TokSpec((), QWEN_SPECIALS, QWEN_ROLES, qwen_template(None))
    return train_tokenizer(spec, corpus=_TOKENIZER_CORPUS, vocab_size=VOCAB_SIZE)


def build_config(tokenizer: Any) -> Any:
    from transformers import Qwen2VLConfig

    rope = {"rope_type": "default", "rope_theta": ROPE_THETA, "mrope_section": MROPE_SECTION}
    text = qwen_text(tokenizer, len(tokenizer), rope_parameters=rope, **TEXT_SHAPE)
    vision = dict(VISION_SHAPE, hidden_size=TEXT_SHAPE["hidden_size"])
    config = Qwen2VLConfig(text_config=text, vision_config=vision, **qwen_ids(tokenizer))
    config.tie_word_embeddings = True
    return config


def preprocessor_config() -> dict[str, Any]:
    pre = qwen_preprocessor(14, "Qwen2VLProcessor", "Qwen2VLImageProcessor", legacy=True)
    pre.update(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, image_mean=IMAGE_MEAN,
               image_std=IMAGE_STD)  # fmt: skip
    pre["size"] = {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
    return pre


class Batcher:
    """Chat-formatted training batches: the prompt as the server's template renders it, then the
    answer and ``<|im_end|>``; labels are -100 everywhere but on the answer's tokens."""

    def __init__(self, tokenizer: Any, image_processor: Any) -> None:
        self.tok = tokenizer
        self.image_processor = image_processor
        self.pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.merge = image_processor.merge_size**2
        self.image = tokenizer.convert_tokens_to_ids("<|image_pad|>")
        self._templates: dict[str, tuple[list[int], list[int]]] = {}

    def prompt_ids(self, question: str, image_tokens: int) -> list[int]:
        if question not in self._templates:
            self._templates[question] = self._template(question)
        before, after = self._templates[question]
        return before + [self.image] * image_tokens + after

    def _template(self, question: str) -> tuple[list[int], list[int]]:
        """The rendered template's ids before and after the image's one placeholder token (the
        placeholder is a special token: tokenizing it once and repeating it gives the same ids
        as tokenizing it repeated)."""
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text",
                                                                  "text": question}]}]  # fmt: skip
        text = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        split = ids.index(self.image)
        return ids[:split], ids[split + 1 :]

    def __call__(self, samples: list[Any]) -> dict[str, torch.Tensor]:
        from sglang.srt.multimodal import fast_preprocess

        pre = fast_preprocess.preprocess(self.image_processor, [s.image for s in samples])
        grids = pre["image_grid_thw"]
        rows, targets, slots = [], [], []
        for sample, grid in zip(samples, grids):
            slots.append(self.slot_targets(sample, int(grid[1]) // 2, int(grid[2]) // 2))
            prompt = self.prompt_ids(sample.question, int(np.prod(grid)) // self.merge)
            answer = self.tok(sample.answer, add_special_tokens=False)["input_ids"] + [self.end]
            rows.append(prompt + answer)
            targets.append([-100] * len(prompt) + answer)
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (row, target) in enumerate(zip(rows, targets)):
            ids[i, : len(row)] = torch.tensor(row)
            labels[i, : len(row)] = torch.tensor(target)
            mask[i, : len(row)] = 1
        return {
            "input_ids": ids,
            "mm_token_type_ids": (ids == self.image).long(),
            "attention_mask": mask,
            "labels": labels,
            "pixel_values": torch.from_numpy(pre["pixel_values"]),
            "image_grid_thw": torch.from_numpy(grids),
            "slot_targets": torch.cat(slots),
        }

    @staticmethod
    def slot_targets(sample: Any, rows: int, cols: int) -> torch.Tensor:
        """(rows x cols tokens, SLOTS): the index in GLYPH_CHARS of the character centred in
        each slot (len(GLYPH_CHARS): none) where the sample knows its glyphs, -100 elsewhere.
        Image tokens run row by row over the image's cells."""
        if sample.glyphs is None:
            return torch.full((rows * cols, SLOTS), -100, dtype=torch.long)
        target = torch.full((rows * cols, SLOTS), len(GLYPH_CHARS), dtype=torch.long)
        for x, y, char in sample.glyphs:
            row = min(rows - 1, max(0, int(y // CELL)))
            col = min(cols - 1, max(0, int(x // CELL)))
            slot = min(SLOTS - 1, max(0, int((x - col * CELL) * SLOTS // CELL)))
            target[row * cols + col, slot] = GLYPH_CHARS.index(char)
        return target


def draw_samples(
    seed: int,
    count: int,
    split: str = "train",
    weights: tuple[float, ...] = CATEGORY_WEIGHTS,
    curriculum: float = 1.0,
) -> list[Any]:
    """``count`` samples: a share max(1 - ``curriculum``, ``STRING_SHARE``) of them random
    strings of at most 1 + 8 x ``curriculum`` characters (``curriculum`` grows from 0 to 1 over
    the start of training), the others drawn from the categories."""
    rng = random.Random(seed)
    out = []
    share = max(1.0 - curriculum, STRING_SHARE) if split == "train" else 0.0
    for category in rng.choices(CATEGORIES, weights=weights, k=count):
        if rng.random() < share:
            out.append(render_string(rng, rng.randint(1, 1 + int(8 * curriculum)), split))
        else:
            out.append(render(category, rng, split))
    return out


def _lr(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def answer_accuracy(model: Any, batch: dict[str, torch.Tensor]) -> tuple[float, float]:
    """Teacher-forced: the fraction of samples whose every answer token is the argmax, and the
    fraction of answer tokens that are."""
    model.eval()
    logits = model(**{k: v for k, v in batch.items() if k not in ("labels", "slot_targets")}).logits
    model.train()
    labels = batch["labels"][:, 1:]
    hit = (logits[:, :-1].argmax(-1) == labels) | (labels == -100)
    tokens = (hit & (labels != -100)).sum() / (labels != -100).sum()
    return float(hit.all(dim=1).float().mean()), float(tokens)


def _accumulate(
    model: Any,
    aux_head: Any,
    tower_out: list,
    batch: dict[str, torch.Tensor],
    slot_weight: float = AUX_WEIGHT,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of one batch under bfloat16 autocast: the answer's loss (mean over its tokens)
    plus ``slot_weight`` times the slot loss (mean over the slots with a target). One call for
    the whole batch: two micro-batches of similar lengths padded less but ran 15% slower (twice
    the small ops)."""
    slot_targets = batch.pop("slot_targets")
    tower_out.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(**batch).loss
        aux = aux_head(tower_out[0]).float().view(-1, len(GLYPH_CHARS) + 1)
    aux_loss = torch.nn.functional.cross_entropy(
        aux, slot_targets.view(-1), ignore_index=-100, reduction="sum"
    ) / max(1, int((slot_targets != -100).sum()))
    (loss + slot_weight * aux_loss).backward()
    return loss.detach(), aux_loss.detach()


def _padded_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor, scaling: float
) -> torch.Tensor:
    """Attention of each image to itself for images whose (tokens, heads, head dim) rows lie one
    after another in ``q``, ``k``, ``v``: one product-softmax-product over the images padded to
    the longest."""
    images, longest = len(lengths), int(lengths.max())
    valid = (torch.arange(longest) < lengths[:, None]).flatten()  # (images x longest)
    padded = []  # (images, heads, longest, head dim), scattered in one call (not per image)
    for t in (q, k, v):
        rows = t.new_zeros(images * longest, *t.shape[1:]).index_put((valid,), t)
        padded.append(rows.view(images, longest, *t.shape[1:]).transpose(1, 2))
    scores = (padded[0] @ padded[1].transpose(-1, -2)) * scaling
    masked = ~valid.view(images, 1, 1, longest)
    scores = scores.float().masked_fill(masked, float("-inf"))
    out = (scores.softmax(-1).to(padded[2].dtype) @ padded[2]).transpose(1, 2)
    return out.reshape(images * longest, -1)[valid]


def batched_vision_attention(
    self: Any,
    hidden_states: torch.Tensor,
    cu_seqlens: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """Qwen2-VL's vision attention as HF defines it (each image attends to itself only), as a
    few padded product-softmax-products: images are grouped by their length rounded up to a
    power of two, so that a batch of one-word images (~16 patches) is not padded to a receipt's
    192. HF's path without flash-attention calls SDPA once per image, 200 calls a training
    step, whose backward passes took a third of the step on a CPU; one padded SDPA call with a
    mask was slower still (its CPU flash backward with a mask). Installed by
    ``install_training_paths`` (training only)."""
    from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb_vision

    seq = hidden_states.shape[0]
    q, k, v = self.qkv(hidden_states).reshape(seq, 3, self.num_heads, -1).permute(1, 0, 2, 3)
    cos, sin = position_embeddings
    q, k = apply_rotary_pos_emb_vision(q, k, cos, sin)
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    bucket = torch.log2(lengths.clamp(min=16).double()).ceil()
    image_of_row = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    order, outs = [], []
    for size in bucket.unique().tolist():
        rows = torch.nonzero(bucket[image_of_row] == size).flatten()  # whole images, in order
        outs.append(_padded_attention(q[rows], k[rows], v[rows], lengths[bucket == size],
                                      self.scaling))  # fmt: skip
        order.append(rows)
    out = torch.cat(outs)[torch.argsort(torch.cat(order))]
    return self.proj(out)


def patch_embedding_as_matmul(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """Qwen2-VL's patch embedding (a Conv3d whose kernel is its stride, over flattened patches)
    as the matrix product it is: the convolution's backward took ~4% of a training step."""
    weight = self.proj.weight.view(self.embed_dim, -1)
    return hidden_states.to(weight.dtype) @ weight.t()


def install_training_paths(model: Any) -> None:
    """The same functions as HF's, on paths that train faster on a CPU: the tower's attention in
    a few padded calls per layer, its patch embedding as a product (both above); the language
    model's attention is HF's eager one (built with ``attn_implementation="eager"``), whose matmuls
    backpropagate several times faster than the CPU flash-attention kernel's backward with a
    padding mask. 0.30 -> 0.22 s per batch of 48 (forward and backward, 2 cores)."""
    visual = model.model.visual
    visual.patch_embed.forward = types.MethodType(patch_embedding_as_matmul, visual.patch_embed)
    for block in visual.blocks:
        block.attn.forward = types.MethodType(batched_vision_attention, block.attn)


def train(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoImageProcessor, GenerationConfig, Qwen2VLForConditionalGeneration

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = build_config(tokenizer)
    write_json(out / "preprocessor_config.json", preprocessor_config())
    image_processor = AutoImageProcessor.from_pretrained(out)
    with torch_seed(args.seed):
        model = Qwen2VLForConditionalGeneration._from_config(config, attn_implementation="eager")
    model.float()
    model.config.use_cache = False
    install_training_paths(model)
    if args.compile:
        # The language model's layers fused by inductor (their norms, rotary embedding and gated
        # MLP are many small ops at these sizes): 0.205 -> 0.183 s a step, for ~40 s of
        # compiling once for every sequence length.
        for layer in model.model.language_model.layers:
            layer.compile(dynamic=True)
    with torch_seed(args.seed + 1):
        aux_head = torch.nn.Linear(config.text_config.hidden_size, SLOTS * (len(GLYPH_CHARS) + 1))
    tower_out: list[torch.Tensor] = []
    model.model.visual.register_forward_hook(lambda m, i, o: tower_out.append(o.pooler_output))
    batcher = Batcher(tokenizer, image_processor)
    params = sum(p.numel() for p in model.parameters())
    named = [*model.named_parameters(), *aux_head.named_parameters()]
    decay = [p for n, p in named if p.ndim >= 2]
    no_decay = [p for n, p in named if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.98), eps=1e-8, fused=True,
    )  # fmt: skip
    probe = batcher(draw_samples(args.seed + 10_000_019, 64, "heldout", args.weights))
    history, start = [], time.perf_counter()
    bar = tqdm(range(args.steps), desc="train reader")
    torch.manual_seed(args.seed)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = _lr(step, args.steps, args.lr, args.warmup)
        curriculum = min(1.0, step / args.curriculum_steps) if args.curriculum_steps else 1.0
        samples = draw_samples(args.seed * 1_000_003 + step, args.batch_size, "train",
                               args.weights, curriculum)  # fmt: skip
        opt.zero_grad(set_to_none=True)
        loss, aux_loss = _accumulate(model, aux_head, tower_out, batcher(samples), args.slot_weight)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.eval_every == 0 or step == args.steps - 1:
            acc, token_acc = answer_accuracy(model, probe)
            elapsed = time.perf_counter() - start
            history.append({"step": step, "loss": float(loss), "slot_loss": float(aux_loss),
                            "heldout_exact": acc, "heldout_tokens": round(token_acc, 3),
                            "seconds": round(elapsed, 1)})  # fmt: skip
            bar.set_postfix(loss=f"{float(loss):.3f}", heldout=f"{acc:.2f}")
            tqdm.write(json.dumps(history[-1]))
    seconds = time.perf_counter() - start
    model.config.use_cache = True
    model.generation_config = GenerationConfig(**qwen_generation(tokenizer))
    model.to(torch.bfloat16 if args.save_dtype == "bfloat16" else torch.float32)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    write_json(out / "video_preprocessor_config.json", qwen_video_preprocessor(14))
    top_level = ("out", "steps", "batch_size", "seed")
    recipe = {k: v for k, v in vars(args).items() if k not in top_level}  # every other option
    report = {"parameters": params, "steps": args.steps, "batch_size": args.batch_size,
              "train_seconds": round(seconds, 1), "seed": args.seed, "recipe": recipe,
              "history": history}  # fmt: skip
    write_json(out / "training_report.json", report)
    return report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.add_argument("--steps", type=int, default=4800)
    p.add_argument("--batch-size", type=int, default=48)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument(
        "--curriculum-steps",
        type=int,
        default=600,
        help="steps over which short random strings give way to the categories",
    )
    p.add_argument("--weights", type=lambda s: tuple(float(w) for w in s.split(",")),
                   default=CATEGORY_WEIGHTS, help="how often each category is drawn")  # fmt: skip
    p.add_argument("--slot-weight", type=float, default=AUX_WEIGHT,
                   help="weight of the tower's slot loss against the answer's")  # fmt: skip
    p.add_argument("--save-dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                   help="compile the language model's layers (inductor)")  # fmt: skip
    return train(p.parse_args(argv))


if __name__ == "__main__":
    main()
