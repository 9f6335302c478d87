"""Tiny random Hugging Face model folders for offline tests.

``build_tiny_model(family, out_dir)`` writes a standard HF checkout (config.json,
model.safetensors, tokenizer.json, tokenizer_config.json, chat template,
generation_config.json and, for VLMs, preprocessor_config.json /
processor_config.json) with randomly initialised float32 weights. Everything is
built locally and deterministically from ``seed``: the byte-level BPE tokenizer is
trained on the small corpus below, and the weights come from a seeded torch init.

``size="small"`` (Qwen families only) gives a heavier model for benchmarks: text hidden 256 with
4 layers, a depth-4 width-384 vision tower and Qwen's real pixel range, so that the vision
encoder's cost is visible and grows with the image's resolution on a CPU.

CLI: ``python -m sglang.testing.tiny_models [--family F] [--out DIR] [--seed S] [--size S]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sglang.testing.tiny_common import (
    _BPE_VOCAB_SIZE,
    _CLIP_MEAN,
    _CLIP_STD,
    _CORPUS,
    _QWEN3_ROPE,
    _QWEN3_VISION,
    _QWEN_ROLES,
    _QWEN_SPECIALS,
    _QWEN_SYSTEM,
    _QWEN_VISION,
    _TEXT,
    _VECTOR_NOISE,
    _qwen_generation,
    _qwen_ids,
    _qwen_preprocessor,
    _qwen_template,
    _qwen_text,
    _Recipe,
    _TokSpec,
    qwen_video_preprocessor,
)
from sglang.testing.tiny_families import FAMILIES as _OTHER_FAMILIES
from sglang.testing.tiny_hybrid import FAMILIES as _HYBRID_FAMILIES

BASE_VLM_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava", "gemma3")
EXTRA_FAMILIES = {**_OTHER_FAMILIES, **_HYBRID_FAMILIES}
EXTRA_VLM_FAMILIES = tuple(_OTHER_FAMILIES)
HYBRID_VLM_FAMILIES = tuple(_HYBRID_FAMILIES)  # linear-attention layers: test_qwen3_5.py
VLM_FAMILIES = BASE_VLM_FAMILIES + EXTRA_VLM_FAMILIES + HYBRID_VLM_FAMILIES
FAMILIES = (*VLM_FAMILIES, "qwen2", "llama")
DEFAULT_FAMILY = "qwen2_5_vl"
# video_preprocessor_config.json: (patch size, video processor class)
VIDEO_FAMILIES = {
    "qwen2_vl": (14, "Qwen2VLVideoProcessor"),
    "qwen2_5_vl": (14, "Qwen2VLVideoProcessor"),
    "qwen3_vl": (16, "Qwen3VLVideoProcessor"),
    "qwen3_5": (16, "Qwen3VLVideoProcessor"),
    "qwen3_5_moe": (16, "Qwen3VLVideoProcessor"),
}
# Bump whenever the recipe changes so that stale cached folders are not reused.
# 5: video_preprocessor_config.json and video parts in Qwen templates; 6: GLM-4.1V,
# LLaVA-OneVision and InternVL video processors and video parts
RECIPE_VERSION = 6

_QWEN_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
IMAGE_PLACEHOLDER: dict[str, str] = {
    "qwen2_vl": _QWEN_IMAGE,
    "qwen2_5_vl": _QWEN_IMAGE,
    "qwen3_vl": _QWEN_IMAGE,
    "llava": "<image>",
    "gemma3": "<start_of_image>",
    **{name: family.placeholder for name, family in EXTRA_FAMILIES.items()},
}
# The token whose embedding rows are an image's (the model's image_token_id).
IMAGE_TOKEN: dict[str, str] = {
    "qwen2_vl": "<|image_pad|>",
    "qwen2_5_vl": "<|image_pad|>",
    "qwen3_vl": "<|image_pad|>",
    "llava": "<image>",
    "gemma3": "<image_soft_token>",
    **{name: family.image_token for name, family in EXTRA_FAMILIES.items()},
}

# ---------------------------------------------------------------------------------------------
# Chat templates (family style; content may be a string or a list of OpenAI-style parts)
# ---------------------------------------------------------------------------------------------

_GEMMA_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- else -%}{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}"
    "{%- endif -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') -}}"
    "{%- if message['content'] is string -%}{{- message['content'] | trim -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] in ('image', 'image_url') -%}{{- '<start_of_image>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] | trim -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<end_of_turn>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)

_LLAVA_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] != 'system' -%}{{- message['role'].upper() + ': ' -}}{%- endif -%}"
    "{%- if message['content'] is string -%}{{- message['content'] + ' ' -}}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] in ('image', 'image_url') -%}{{- '<image>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] + ' ' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'ASSISTANT:' -}}{%- endif -%}"
)

_LLAMA_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] | trim -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] | trim -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)

# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------

_GEMMA_TAIL = (
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
)
_GEMMA_ROLES = {
    "pad_token": "<pad>",
    "eos_token": "<eos>",
    "bos_token": "<bos>",
    "unk_token": "<unk>",
    "mask_token": "<mask>",
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
    "image_token": "<image_soft_token>",
}
_LLAVA_ROLES = {
    "unk_token": "<unk>",
    "bos_token": "<s>",
    "eos_token": "</s>",
    "pad_token": "<pad>",
    "image_token": "<image>",
}
_LLAMA_TAIL = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
)
_LLAMA_ROLES = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
_GEMMA_HEAD = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")
_TOK_SPECS: dict[str, _TokSpec] = {
    "qwen2_vl": _TokSpec((), _QWEN_SPECIALS, _QWEN_ROLES, _qwen_template(_QWEN_SYSTEM)),
    "qwen2_5_vl": _TokSpec((), _QWEN_SPECIALS, _QWEN_ROLES, _qwen_template(_QWEN_SYSTEM)),
    "qwen3_vl": _TokSpec((), _QWEN_SPECIALS, _QWEN_ROLES, _qwen_template(None)),
    "qwen2": _TokSpec((), _QWEN_SPECIALS, _QWEN_ROLES, _qwen_template(_QWEN_SYSTEM)),
    "gemma3": _TokSpec(_GEMMA_HEAD, _GEMMA_TAIL, _GEMMA_ROLES, _GEMMA_TEMPLATE, add_bos=True),
    "llava": _TokSpec(
        ("<unk>", "<s>", "</s>"), ("<image>", "<pad>"), _LLAVA_ROLES, _LLAVA_TEMPLATE, add_bos=True
    ),
    "llama": _TokSpec((), _LLAMA_TAIL, _LLAMA_ROLES, _LLAMA_TEMPLATE, add_bos=True),
    **{name: family.tokenizer for name, family in EXTRA_FAMILIES.items()},
}


def _build_tokenizer(family: str) -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.trainers import BpeTrainer
    from transformers import PreTrainedTokenizerFast

    spec = _TOK_SPECS[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=_BPE_VOCAB_SIZE,
        min_frequency=1,
        show_progress=False,
        special_tokens=list(spec.head),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_CORPUS.splitlines(keepends=True), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in spec.head])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in spec.tail])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in spec.plain])
    if spec.add_bos:
        bos = spec.roles["bos_token"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A",
            pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, tok.token_to_id(bos))],
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        chat_template=spec.chat_template,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
        **spec.roles,
    )


# ---------------------------------------------------------------------------------------------
# Model configs
# ---------------------------------------------------------------------------------------------

_GEMMA_POST_NORM_BOOST = 3.0
_GEMMA_POST_NORMS = ("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")
SIZES = ("tiny", "small")
SMALL_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5")
# "small": overrides of the tiny recipe (text, vision tower, pixel range).
_SMALL_TEXT = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,  # head_dim stays 32: the mrope sections still fit
    "num_key_value_heads": 4,
    "max_position_embeddings": 65536,
}
_SMALL_VISION = {
    "qwen2_vl": {"depth": 4, "embed_dim": 384, "num_heads": 6, "mlp_ratio": 4, "hidden_size": 256},
    "qwen2_5_vl": {
        "depth": 4,
        "hidden_size": 384,
        "num_heads": 6,
        "intermediate_size": 1024,
        "out_hidden_size": 256,
        "window_size": 112,
        "fullatt_block_indexes": [1, 3],
    },
    "qwen3_vl": {
        "depth": 4,
        "hidden_size": 384,
        "num_heads": 6,
        "intermediate_size": 1024,
        "out_hidden_size": 256,
        "deepstack_visual_indexes": [1, 3],
    },
    "qwen3_5": {
        "depth": 4,
        "hidden_size": 384,
        "num_heads": 6,
        "intermediate_size": 1024,
        "out_hidden_size": 256,
    },
}
_SMALL_MIN_PIXELS, _SMALL_MAX_PIXELS = 56 * 56, 16384 * 28 * 28


def _recipe_qwen2_vl(tok: Any, vocab: int) -> _Recipe:
    from transformers import Qwen2VLConfig

    rope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 6, 6]}
    config = Qwen2VLConfig(
        text_config=_qwen_text(tok, vocab, rope_parameters=rope),
        vision_config=dict(_QWEN_VISION, embed_dim=64, hidden_size=128, mlp_ratio=2, patch_size=14),
        **_qwen_ids(tok),
    )
    pre = _qwen_preprocessor(14, "Qwen2VLProcessor", "Qwen2VLImageProcessor", legacy=True)
    return _Recipe(config, "AutoModelForImageTextToText", _qwen_generation(tok), pre)


def _recipe_qwen2_5_vl(tok: Any, vocab: int) -> _Recipe:
    from transformers import Qwen2_5_VLConfig

    rope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 6, 6]}
    config = Qwen2_5_VLConfig(
        text_config=_qwen_text(tok, vocab, rope_parameters=rope),
        vision_config=dict(
            _QWEN_VISION,
            hidden_size=64,
            intermediate_size=128,
            out_hidden_size=128,
            patch_size=14,
            window_size=56,  # 2x2 merged patches per window: several windows per image
            fullatt_block_indexes=[1],  # block 0 windowed, block 1 full attention
            tokens_per_second=2,
        ),
        **_qwen_ids(tok),
    )
    pre = _qwen_preprocessor(14, "Qwen2_5_VLProcessor", "Qwen2VLImageProcessor", legacy=True)
    return _Recipe(config, "AutoModelForImageTextToText", _qwen_generation(tok), pre)


def _recipe_qwen3_vl(tok: Any, vocab: int) -> _Recipe:
    from transformers import Qwen3VLConfig

    rope = _QWEN3_ROPE
    config = Qwen3VLConfig(
        text_config=_qwen_text(tok, vocab, head_dim=32, rope_parameters=rope),
        vision_config=_QWEN3_VISION,
        **_qwen_ids(tok),
    )
    pre = _qwen_preprocessor(16, "Qwen3VLProcessor", "Qwen2VLImageProcessorFast", legacy=False)
    return _Recipe(config, "AutoModelForImageTextToText", _qwen_generation(tok), pre)


def _recipe_llava(tok: Any, vocab: int) -> _Recipe:
    from transformers import LlavaConfig

    t = tok.convert_tokens_to_ids
    text = dict(
        _TEXT,
        model_type="llama",
        vocab_size=vocab,
        bos_token_id=t("<s>"),
        eos_token_id=t("</s>"),
        pad_token_id=t("<pad>"),
        rms_norm_eps=1e-5,
    )
    vision = dict(
        model_type="clip_vision_model",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=56,
        patch_size=14,
        projection_dim=64,
        hidden_act="quick_gelu",
    )
    config = LlavaConfig(
        text_config=text,
        vision_config=vision,
        image_token_index=t("<image>"),
        image_seq_length=16,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        pad_token_id=t("<pad>"),
    )
    pre = {
        "crop_size": {"height": 56, "width": 56},
        "do_center_crop": True,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": _CLIP_MEAN,
        "image_processor_type": "CLIPImageProcessor",
        "image_std": _CLIP_STD,
        "processor_class": "LlavaProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": 56},
    }
    proc = {
        "image_token": "<image>",
        "num_additional_image_tokens": 1,
        "patch_size": 14,
        "processor_class": "LlavaProcessor",
        "vision_feature_select_strategy": "default",
    }
    gen = {"bos_token_id": t("<s>"), "eos_token_id": t("</s>"), "pad_token_id": t("<pad>")}
    return _Recipe(config, "AutoModelForImageTextToText", gen, pre, proc)


def _recipe_gemma3(tok: Any, vocab: int) -> _Recipe:
    from transformers import Gemma3Config

    t = tok.convert_tokens_to_ids
    layer_types = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
    text = dict(
        _TEXT,
        num_hidden_layers=4,
        layer_types=layer_types,
        sliding_window=32,
        head_dim=32,
        query_pre_attn_scalar=32,
        initializer_range=0.02,
        vocab_size=vocab,
        pad_token_id=t("<pad>"),
        eos_token_id=t("<eos>"),
        bos_token_id=t("<bos>"),
    )
    vision = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=64,
        patch_size=8,
        vision_use_head=False,
    )
    config = Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=16,
        boi_token_index=t("<start_of_image>"),
        eoi_token_index=t("<end_of_image>"),
        image_token_index=t("<image_soft_token>"),
        initializer_range=0.02,
    )
    pre = {
        "do_convert_rgb": None,
        "do_normalize": True,
        "do_pan_and_scan": None,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_processor_type": "Gemma3ImageProcessor",
        "image_seq_length": 16,
        "image_std": [0.5, 0.5, 0.5],
        "pan_and_scan_max_num_crops": None,
        "pan_and_scan_min_crop_size": None,
        "pan_and_scan_min_ratio_to_activate": None,
        "processor_class": "Gemma3Processor",
        "resample": 2,
        "rescale_factor": 1 / 255,
        "size": {"height": 64, "width": 64},
    }
    proc = {"image_seq_length": 16, "processor_class": "Gemma3Processor"}
    eos = [t("<eos>"), t("<end_of_turn>")]
    gen = {"bos_token_id": t("<bos>"), "eos_token_id": eos, "pad_token_id": t("<pad>")}
    return _Recipe(config, "AutoModelForImageTextToText", gen, pre, proc)


def _recipe_qwen2(tok: Any, vocab: int) -> _Recipe:
    from transformers import Qwen2Config

    config = Qwen2Config(**_qwen_text(tok, vocab), tie_word_embeddings=True)
    return _Recipe(config, "AutoModelForCausalLM", _qwen_generation(tok))


def _recipe_llama(tok: Any, vocab: int) -> _Recipe:
    from transformers import LlamaConfig

    t = tok.convert_tokens_to_ids
    bos, eos = t("<|begin_of_text|>"), [t("<|end_of_text|>"), t("<|eot_id|>")]
    config = LlamaConfig(
        **_TEXT, vocab_size=vocab, bos_token_id=bos, eos_token_id=eos, rms_norm_eps=1e-5
    )
    return _Recipe(config, "AutoModelForCausalLM", {"bos_token_id": bos, "eos_token_id": eos})


_RECIPES: dict[str, Callable[[Any, int], _Recipe]] = {
    "qwen2_vl": _recipe_qwen2_vl,
    "qwen2_5_vl": _recipe_qwen2_5_vl,
    "qwen3_vl": _recipe_qwen3_vl,
    "llava": _recipe_llava,
    "gemma3": _recipe_gemma3,
    "qwen2": _recipe_qwen2,
    "llama": _recipe_llama,
    **{name: family.recipe for name, family in EXTRA_FAMILIES.items()},
}


# ---------------------------------------------------------------------------------------------
# Build + cache
# ---------------------------------------------------------------------------------------------


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def build_tiny_model(family: str, out_dir: str | Path, seed: int = 0, size: str = "tiny") -> Path:
    """Build a tiny random HF checkout of ``family`` into ``out_dir`` and return its path.

    ``size="small"`` (Qwen VLM families) builds the heavier benchmark variant."""
    import torch
    import transformers

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    if size not in SIZES or (size == "small" and family not in SMALL_FAMILIES):
        raise ValueError(f"size {size!r} is not available for {family!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = _build_tokenizer(family)
    vocab = len(tokenizer)
    recipe = _RECIPES[family](tokenizer, vocab)
    if size == "small":
        recipe = _small(recipe, family)
        tokenizer.model_max_length = _SMALL_TEXT["max_position_embeddings"]
    recipe.config.dtype = torch.float32
    auto_cls = getattr(transformers, recipe.auto_class)
    with _torch_seed(seed):
        model = auto_cls.from_config(recipe.config, dtype=torch.float32)
        _randomize_constants(model)
    model.generation_config = transformers.GenerationConfig(**recipe.generation)
    with _quiet_progress_bars():
        model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    # Published-style spellings that older readers expect.
    _patch_json(out / "config.json", torch_dtype="float32")
    bos = {"add_bos_token": True, "add_eos_token": False} if _TOK_SPECS[family].add_bos else {}
    _patch_json(out / "tokenizer_config.json", tokenizer_class="PreTrainedTokenizerFast", **bos)
    if recipe.preprocessor is not None:
        _write_json(out / "preprocessor_config.json", recipe.preprocessor)
    if recipe.processor is not None:
        _write_json(out / "processor_config.json", recipe.processor)
    if family in VIDEO_FAMILIES:
        video = VIDEO_FAMILIES[family]
        _write_json(out / "video_preprocessor_config.json", qwen_video_preprocessor(*video))
    if recipe.video_preprocessor is not None:
        _write_json(out / "video_preprocessor_config.json", recipe.video_preprocessor)
    return out


def _small(recipe: _Recipe, family: str) -> _Recipe:
    """The "small" variant of a Qwen VLM recipe: the same config class rebuilt with overrides."""
    data = recipe.config.to_dict()
    text = {k: v for k, v in data["text_config"].items() if k != "layer_types"}
    data["text_config"] = {**text, **_SMALL_TEXT}
    data["vision_config"] = {**data["vision_config"], **_SMALL_VISION[family]}
    config = type(recipe.config)(**data)
    pre = dict(recipe.preprocessor or {})
    pre["size"] = {"shortest_edge": _SMALL_MIN_PIXELS, "longest_edge": _SMALL_MAX_PIXELS}
    if "max_pixels" in pre:
        pre.update(min_pixels=_SMALL_MIN_PIXELS, max_pixels=_SMALL_MAX_PIXELS)
    return _Recipe(config, recipe.auto_class, recipe.generation, pre, recipe.processor)


def _randomize_constants(model: Any) -> None:
    """Randomise parameters that HF initialises to constants: 1-D ones (norm weights, biases)
    get noise, so a loader that skips them is caught; constant matrices (Gemma3's zero-init
    ``mm_input_projection_weight``, which would make images invisible) get a normal init.
    Gemma's sandwich post-norms are amplified, otherwise the tied, sqrt(hidden)-scaled
    embeddings dominate the residual stream and greedy decoding mostly repeats a token."""
    import torch

    gemma = "gemma" in type(model).__name__.lower()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not param.is_floating_point():
                continue
            if param.ndim == 1:
                param.add_(torch.randn_like(param) * _VECTOR_NOISE)
                if gemma and name.endswith(_GEMMA_POST_NORMS):
                    param.add_(_GEMMA_POST_NORM_BOOST)
            elif param.numel() > 1 and bool((param == param.flatten()[0]).all()):
                param.normal_(0.0, _TEXT["initializer_range"])


def _patch_json(path: Path, **updates: Any) -> None:
    _write_json(path, {**json.loads(path.read_text()), **updates})


@contextlib.contextmanager
def _quiet_progress_bars() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def _torch_seed(seed: int) -> Iterator[None]:
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _cache_root() -> Path:
    base = os.environ.get("SGLANG_CACHE_DIR") or Path.home() / ".cache" / "sglang"
    return Path(base) / "tiny-models"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX: rely on the atomic rename only
        yield
        return
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def tiny_model_path(family: str, size: str = "tiny") -> Path:
    """Return a cached tiny checkout of ``family`` (built once, safe across processes)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    root = _cache_root()
    suffix = "" if size == "tiny" else f"-{size}"
    final = root / f"{family}{suffix}-v{RECIPE_VERSION}"
    if (final / "config.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / f".{final.name}.lock"):
        if (final / "config.json").is_file():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
        os.chmod(tmp, 0o755)
        try:
            build_tiny_model(family, tmp, size=size)
            os.replace(tmp, final)
        except OSError:
            if not (final / "config.json").is_file():
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def default_model_path() -> Path:
    """Return the cached default tiny model (Qwen2.5-VL)."""
    return tiny_model_path(DEFAULT_FAMILY)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=FAMILIES, default=None)
    parser.add_argument("--out", default=None, help="output folder (default: the cache)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", choices=SIZES, default="tiny")
    args = parser.parse_args(argv)
    family = args.family or DEFAULT_FAMILY
    if args.out is None:
        print(tiny_model_path(family, size=args.size))
    else:
        print(build_tiny_model(family, args.out, seed=args.seed, size=args.size))


if __name__ == "__main__":
    main()
