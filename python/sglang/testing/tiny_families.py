"""Tiny recipes for the VLM families users bring (InternVL, LLaVA-NeXT, Granite Vision, ...).

Each family is laid out as its published checkpoints are: the processor class they name, the
family's special tokens (as tokenizer attributes where the processor reads them) and a chat
template in the family's style. Sizes are tiny but keep each family's structure: several tiles
per image where the family tiles, row breaks where it breaks rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sglang.testing.tiny_common import (
    _CLIP_MEAN,
    _CLIP_STD,
    _QWEN3_ROPE,
    _QWEN3_VISION,
    _QWEN_ROLES,
    _QWEN_SPECIALS,
    _QWEN_SYSTEM,
    _QWEN_VISION,
    _TEXT,
    _qwen_generation,
    _qwen_ids,
    _qwen_preprocessor,
    _qwen_template,
    _qwen_text,
    _Recipe,
    _TokSpec,
)

_IMAGENET_MEAN = [0.485, 0.456, 0.406]
_IMAGENET_STD = [0.229, 0.224, 0.225]
_SMALL_VIT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}


@dataclass(frozen=True)
class Family:
    tokenizer: _TokSpec
    recipe: Callable[[Any, int], _Recipe]
    placeholder: str  # what a prompt writes for one image
    image_token: str  # the token whose embedding rows are the image's


def _chatml(
    image_text: str, system: str | None = _QWEN_SYSTEM, video_text: str | None = None
) -> str:
    """A Qwen-style ChatML template that writes ``image_text`` for every image part (and
    ``video_text`` for every video part)."""
    template = _qwen_template(system)
    template = template.replace("<|vision_start|><|image_pad|><|vision_end|>", image_text)
    if video_text is not None:
        template = template.replace("<|vision_start|><|video_pad|><|vision_end|>", video_text)
    return template


def _content(image_text: str, video_text: str | None = None) -> str:
    """Jinja writing a message's content: a string, or OpenAI-style parts where every image part
    becomes ``image_text`` (and every video part ``video_text``)."""
    video = (
        "{%- elif part['type'] in ('video', 'video_url') -%}{{- '" + video_text + "' -}}"
        if video_text is not None
        else ""
    )
    return (
        "{%- if message['content'] is string -%}{{- message['content'] -}}"
        "{%- else -%}{%- for part in message['content'] -%}"
        "{%- if part['type'] in ('image', 'image_url') -%}{{- '"
        + image_text
        + "' -}}"
        + video
        + "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
        "{%- endfor -%}{%- endif -%}"
    )


# InternVL 3 (-hf checkpoints): Qwen2 LM; tiles of 448 (here 56) plus a thumbnail --------------
_INTERNVL_TOKENS = {"start_image_token": "<img>", "end_image_token": "</img>"}
_INTERNVL_ROLES = {
    **_QWEN_ROLES,
    **_INTERNVL_TOKENS,
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}


def _recipe_internvl(tok: Any, vocab: int) -> _Recipe:
    from transformers import InternVLConfig

    config = InternVLConfig(
        text_config=dict(_qwen_text(tok, vocab), model_type="qwen2"),
        vision_config=dict(_SMALL_VIT, image_size=[56, 56], patch_size=[14, 14]),
        image_token_id=tok.convert_tokens_to_ids("<IMG_CONTEXT>"),
        image_seq_length=4,
        downsample_ratio=0.5,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )
    pre = {
        "crop_to_patches": False,  # the processor turns tiling on, the image processor does not
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": _IMAGENET_MEAN,
        "image_processor_type": "GotOcr2ImageProcessorFast",
        "image_std": _IMAGENET_STD,
        "max_patches": 6,
        "min_patches": 1,
        "processor_class": "InternVLProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"height": 56, "width": 56},
    }
    proc = {"image_seq_length": 4, "processor_class": "InternVLProcessor"}
    # InternVLVideoProcessor: every frame resized to one tile
    video = {
        "image_mean": _IMAGENET_MEAN,
        "image_std": _IMAGENET_STD,
        "initial_shift": True,
        "resample": 3,
        "size": {"height": 56, "width": 56},
        "video_processor_type": "InternVLVideoProcessor",
    }
    gen = _qwen_generation(tok)
    return _Recipe(config, "AutoModelForImageTextToText", gen, pre, proc, video)


# LLaVA-NeXT (llava-v1.6-mistral-7b-hf layout): anyres tiles at 336 (here 28) -------------------
_LLAVA_HEAD = ("<unk>", "<s>", "</s>")
_LLAVA_ROLES = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
_MISTRAL_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{{- '[INST] ' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] in ('image', 'image_url') -%}{{- '<image>\\n' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{{- ' [/INST]' -}}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{- ' ' + (message['content'] if message['content'] is string"
    " else message['content'][0]['text']) + eos_token -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
)
_ANYRES_PINPOINTS = [[28, 56], [56, 28], [56, 56], [84, 28], [28, 84]]


def _clip_vision(**extra: Any) -> dict[str, Any]:
    base = dict(_SMALL_VIT, model_type="clip_vision_model", image_size=28, patch_size=14)
    return {**base, "projection_dim": 64, "hidden_act": "quick_gelu", **extra}


def _llava_text(tok: Any, vocab: int, model_type: str, **extra: Any) -> dict[str, Any]:
    t = tok.convert_tokens_to_ids
    return dict(
        _TEXT,
        model_type=model_type,
        vocab_size=vocab,
        bos_token_id=t("<s>"),
        eos_token_id=t("</s>"),
        pad_token_id=t("<pad>"),
        rms_norm_eps=1e-5,
        **extra,
    )


def _llava_generation(tok: Any) -> dict[str, Any]:
    t = tok.convert_tokens_to_ids
    return {"bos_token_id": t("<s>"), "eos_token_id": t("</s>"), "pad_token_id": t("<pad>")}


def _anyres_preprocessor(processor_class: str, mean: list, std: list, **extra: Any) -> dict:
    return {
        "aspect_ratio_setting": "anyres",
        "crop_size": {"height": 28, "width": 28},
        "do_center_crop": True,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_pad": True,
        "do_rescale": True,
        "do_resize": True,
        "image_grid_pinpoints": _ANYRES_PINPOINTS,
        "image_mean": mean,
        "image_processor_type": "LlavaNextImageProcessor",
        "image_std": std,
        "processor_class": processor_class,
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": 28},
        **extra,
    }


def _recipe_llava_next(tok: Any, vocab: int) -> _Recipe:
    from transformers import LlavaNextConfig

    config = LlavaNextConfig(
        text_config=_llava_text(tok, vocab, "mistral", sliding_window=None, head_dim=32),
        vision_config=_clip_vision(),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        image_grid_pinpoints=_ANYRES_PINPOINTS,
        image_seq_length=4,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
    )
    pre = _anyres_preprocessor("LlavaNextProcessor", _CLIP_MEAN, _CLIP_STD)
    proc = {
        "image_token": "<image>",
        "num_additional_image_tokens": 1,
        "patch_size": 14,
        "processor_class": "LlavaNextProcessor",
        "vision_feature_select_strategy": "default",
    }
    return _Recipe(config, "AutoModelForImageTextToText", _llava_generation(tok), pre, proc)


# Granite Vision 3.x: LLaVA-NeXT with a SigLIP tower, several feature layers concatenated and a
# Granite LM (embedding / residual / attention multipliers, logits scaling) ---------------------
_GRANITE_TAIL = ("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "<image>", "<pad>")
_GRANITE_ROLES = {
    "bos_token": "<|end_of_text|>",
    "eos_token": "<|end_of_text|>",
    "pad_token": "<pad>",
    "unk_token": "<|end_of_text|>",
}
_GRANITE_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|start_of_role|>' + message['role'] + '<|end_of_role|>' -}}"
    + _content("<image>\\n")
    + "{{- '<|end_of_text|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_of_role|>assistant<|end_of_role|>' -}}"
    "{%- endif -%}"
)


def _granite_text(tok: Any, vocab: int, model_type: str, **extra: Any) -> dict[str, Any]:
    """A Granite LM: embedding, residual and attention multipliers and logits scaling."""
    t = tok.convert_tokens_to_ids
    return dict(
        _TEXT,
        model_type=model_type,
        vocab_size=vocab,
        bos_token_id=t("<|end_of_text|>"),
        eos_token_id=t("<|end_of_text|>"),
        pad_token_id=t("<pad>"),
        embedding_multiplier=12.0,
        logits_scaling=8.0,
        residual_multiplier=0.22,
        attention_multiplier=0.015625,
        **extra,
    )


def _recipe_granite_vision(tok: Any, vocab: int) -> _Recipe:
    from transformers import LlavaNextConfig

    t = tok.convert_tokens_to_ids
    text = _granite_text(tok, vocab, "granite", tie_word_embeddings=True)
    vision = dict(_SMALL_VIT, model_type="siglip_vision_model", image_size=28, patch_size=14)
    vision["num_hidden_layers"] = 3
    config = LlavaNextConfig(
        text_config=text,
        vision_config=vision,
        image_token_index=t("<image>"),
        image_grid_pinpoints=_ANYRES_PINPOINTS,
        image_seq_length=4,
        vision_feature_layer=[-3, -2, -1],
        vision_feature_select_strategy="full",
        tie_word_embeddings=True,
    )
    pre = _anyres_preprocessor("LlavaNextProcessor", [0.5] * 3, [0.5] * 3)
    proc = {
        "image_token": "<image>",
        "num_additional_image_tokens": 0,
        "patch_size": 14,
        "processor_class": "LlavaNextProcessor",
        "vision_feature_select_strategy": "full",
    }
    gen = {"bos_token_id": t("<|end_of_text|>"), "eos_token_id": t("<|end_of_text|>")}
    return _Recipe(config, "AutoModelForImageTextToText", gen, pre, proc)


# LLaVA-OneVision (llava-onevision-qwen2-*-ov-hf): SigLIP + Qwen2, anyres_max_9 ----------------
def _recipe_llava_onevision(tok: Any, vocab: int) -> _Recipe:
    from transformers import LlavaOnevisionConfig

    config = LlavaOnevisionConfig(
        text_config=dict(_qwen_text(tok, vocab), model_type="qwen2"),
        vision_config=dict(
            _SMALL_VIT, model_type="siglip_vision_model", image_size=28, patch_size=14
        ),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        video_token_index=tok.convert_tokens_to_ids("<video>"),
        image_grid_pinpoints=_ANYRES_PINPOINTS,
        vision_aspect_ratio="anyres_max_9",
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
    )
    pre = _anyres_preprocessor("LlavaOnevisionProcessor", [0.5] * 3, [0.5] * 3)
    pre.update(
        image_processor_type="LlavaOnevisionImageProcessor", size={"height": 28, "width": 28}
    )
    del pre["crop_size"], pre["do_center_crop"], pre["aspect_ratio_setting"]
    proc = {
        "image_token": "<image>",
        "num_image_tokens": 4,
        "processor_class": "LlavaOnevisionProcessor",
        "video_token": "<video>",
        "vision_aspect_ratio": "anyres_max_9",
        "vision_feature_select_strategy": "full",
    }
    # LlavaOnevisionVideoProcessor: every frame resized to the tower's view
    video = {
        "image_mean": [0.5] * 3,
        "image_std": [0.5] * 3,
        "resample": 3,
        "size": {"height": 28, "width": 28},
        "video_processor_type": "LlavaOnevisionVideoProcessor",
    }
    gen = _qwen_generation(tok)
    return _Recipe(config, "AutoModelForImageTextToText", gen, pre, proc, video)


# Mistral3 (Mistral-Small-3.1): Pixtral tower, [IMG] runs broken by [IMG_BREAK] per row ------------
_MISTRAL3_TAIL = ("[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]")
_MISTRAL3_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{{- '[INST]' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] in ('image', 'image_url') -%}{{- '[IMG]' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{{- '[/INST]' -}}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{- (message['content'] if message['content'] is string"
    " else message['content'][0]['text']) + eos_token -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
)


def _recipe_mistral3(tok: Any, vocab: int) -> _Recipe:
    from transformers import Mistral3Config

    vision = dict(_SMALL_VIT, model_type="pixtral", image_size=112, patch_size=14, head_dim=16)
    config = Mistral3Config(
        text_config=_llava_text(tok, vocab, "mistral", sliding_window=None, head_dim=32),
        vision_config=vision,
        image_token_index=tok.convert_tokens_to_ids("[IMG]"),
        spatial_merge_size=2,
        vision_feature_layer=-1,
        multimodal_projector_bias=False,
        projector_hidden_act="gelu",
    )
    pre = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": _CLIP_MEAN,
        "image_processor_type": "PixtralImageProcessor",
        "image_std": _CLIP_STD,
        "patch_size": 14,
        "processor_class": "PixtralProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"longest_edge": 112},
    }
    proc = {
        "image_break_token": "[IMG_BREAK]",
        "image_end_token": "[IMG_END]",
        "image_token": "[IMG]",
        "patch_size": 14,
        "processor_class": "PixtralProcessor",
        "spatial_merge_size": 2,
    }
    return _Recipe(config, "AutoModelForImageTextToText", _llava_generation(tok), pre, proc)


# Idefics3 / SmolVLM: tiles with <row_i_col_j> tags around <image> runs, a global view last ------
_ROW_COL = tuple(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7))
_IDEFICS_TAIL = ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>")


def _idefics_template(bos: str) -> str:
    return (
        "{{- " + bos + " -}}"
        "{%- for message in messages -%}"
        "{{- message['role'] | capitalize -}}"
        "{%- if message['content'] is string -%}{{- ': ' + message['content'] -}}"
        "{%- else -%}{{- ':' -}}{%- for part in message['content'] -%}"
        "{%- if part['type'] in ('image', 'image_url') -%}{{- '<image>' -}}"
        "{%- elif part['type'] == 'text' -%}{{- ' ' + part['text'] -}}{%- endif -%}"
        "{%- endfor -%}{%- endif -%}"
        "{{- '<end_of_utterance>\\n' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- 'Assistant:' -}}{%- endif -%}"
    )


def _idefics_preprocessor(processor_class: str, image_type: str, tile: int) -> dict[str, Any]:
    return {
        "do_convert_rgb": True,
        "do_image_splitting": True,
        "do_normalize": True,
        "do_pad": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5] * 3,
        "image_processor_type": image_type,
        "image_std": [0.5] * 3,
        "max_image_size": {"longest_edge": tile},
        "processor_class": processor_class,
        "resample": 1,
        "rescale_factor": 1 / 255,
        "size": {"longest_edge": 2 * tile},
    }


def _recipe_idefics3(tok: Any, vocab: int) -> _Recipe:
    from transformers import Idefics3Config

    t = tok.convert_tokens_to_ids
    text = dict(
        _TEXT,
        model_type="llama",
        vocab_size=vocab,
        bos_token_id=t("<|begin_of_text|>"),
        eos_token_id=[t("<|end_of_text|>"), t("<end_of_utterance>")],
        pad_token_id=t("<|end_of_text|>"),
        rms_norm_eps=1e-5,
    )
    config = Idefics3Config(
        text_config=text,
        vision_config=dict(_SMALL_VIT, image_size=56, patch_size=14),
        image_token_id=t("<image>"),
        scale_factor=2,
    )
    pre = _idefics_preprocessor("Idefics3Processor", "Idefics3ImageProcessor", 56)
    proc = {"image_seq_len": 4, "processor_class": "Idefics3Processor"}
    gen = {"bos_token_id": t("<|begin_of_text|>"), "eos_token_id": text["eos_token_id"]}
    return _Recipe(config, "AutoModelForImageTextToText", gen, pre, proc)


_SMOLVLM_ROLES = {
    "bos_token": "<|im_start|>",
    "eos_token": "<end_of_utterance>",
    "pad_token": "<|im_end|>",
    "unk_token": "<|endoftext|>",
    "fake_image_token": "<fake_token_around_image>",
    "image_token": "<image>",
    "global_image_token": "<global-img>",
    "end_of_utterance_token": "<end_of_utterance>",
}


def _recipe_smolvlm(tok: Any, vocab: int) -> _Recipe:
    from transformers import SmolVLMConfig

    t = tok.convert_tokens_to_ids
    text = dict(
        _TEXT,
        model_type="llama",
        vocab_size=vocab,
        bos_token_id=t("<|im_start|>"),
        eos_token_id=t("<end_of_utterance>"),
        pad_token_id=t("<|im_end|>"),
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    )
    config = SmolVLMConfig(
        text_config=text,
        vision_config=dict(_SMALL_VIT, image_size=64, patch_size=16),
        image_token_id=t("<image>"),
        scale_factor=2,
        tie_word_embeddings=True,
    )
    pre = _idefics_preprocessor("SmolVLMProcessor", "SmolVLMImageProcessor", 64)
    proc = {"image_seq_len": 4, "processor_class": "SmolVLMProcessor"}
    gen = {"bos_token_id": t("<|im_start|>"), "eos_token_id": t("<end_of_utterance>")}
    return _Recipe(config, "AutoModelForImageTextToText", gen, pre, proc)


# Qwen3-VL-MoE (Qwen3-VL-30B-A3B): the Qwen3-VL layout and deepstack with an MoE LM ------------
def _recipe_qwen3_vl_moe(tok: Any, vocab: int) -> _Recipe:
    from transformers import Qwen3VLMoeConfig

    rope = _QWEN3_ROPE
    text = _qwen_text(
        tok,
        vocab,
        head_dim=32,
        rope_parameters=rope,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        decoder_sparse_step=1,
    )
    config = Qwen3VLMoeConfig(
        text_config=text,
        vision_config=_QWEN3_VISION,
        **_qwen_ids(tok),
    )
    pre = _qwen_preprocessor(16, "Qwen3VLProcessor", "Qwen2VLImageProcessorFast", legacy=False)
    return _Recipe(config, "AutoModelForImageTextToText", _qwen_generation(tok), pre)


# GLM-4.1V (GLM-4.1V-9B-Thinking): <|begin_of_image|> <|image|>*N <|end_of_image|>, M-RoPE -------
_GLM_SPECIALS = (
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
    "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>",
    "<|begin_of_video|>", "<|end_of_video|>", "<|image|>", "<|video|>",
)  # fmt: skip
_GLM_IMAGE = "<|begin_of_image|><|image|><|end_of_image|>"
_GLM_VIDEO = "<|begin_of_video|><|video|><|end_of_video|>"
_GLM_TEMPLATE = (
    "[gMASK]<sop>"
    "{%- for message in messages -%}"
    "{{- '<|' + message['role'] + '|>\\n' -}}" + _content(_GLM_IMAGE, _GLM_VIDEO) + "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)


def _recipe_glm4v(tok: Any, vocab: int) -> _Recipe:
    from transformers import Glm4vConfig

    t = tok.convert_tokens_to_ids
    eos = [t("<|endoftext|>"), t("<|user|>"), t("<|observation|>")]
    rope = {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "mrope_section": [2, 3, 3],
        "partial_rotary_factor": 0.5,
    }
    text = dict(
        _TEXT,
        vocab_size=vocab,
        rope_parameters=rope,
        eos_token_id=eos,
        pad_token_id=t("<|endoftext|>"),
    )
    vision = dict(
        _QWEN_VISION,
        hidden_size=64,
        intermediate_size=128,
        out_hidden_size=128,
        patch_size=14,
        image_size=56,
    )
    config = Glm4vConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=t("<|image|>"),
        video_token_id=t("<|video|>"),
        image_start_token_id=t("<|begin_of_image|>"),
        image_end_token_id=t("<|end_of_image|>"),
        video_start_token_id=t("<|begin_of_video|>"),
        video_end_token_id=t("<|end_of_video|>"),
    )
    pre = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": _CLIP_MEAN,
        "image_processor_type": "Glm4vImageProcessor",
        "image_std": _CLIP_STD,
        "merge_size": 2,
        "patch_size": 14,
        "processor_class": "Glm4vProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": 56 * 56, "longest_edge": 112 * 112},
        "temporal_patch_size": 2,
    }
    gen = {"eos_token_id": eos, "pad_token_id": t("<|endoftext|>")}
    # Glm4vVideoProcessor's layout; bounds on frames x height x width, as its size rule reads
    video = {
        key: pre[key]
        for key in ("image_mean", "image_std", "merge_size", "patch_size", "temporal_patch_size")
    }
    video.update(
        size={"shortest_edge": 56 * 56 * 2, "longest_edge": 56 * 56 * 8},
        fps=2,
        video_processor_type="Glm4vVideoProcessor",
    )
    return _Recipe(config, "AutoModelForImageTextToText", gen, pre, video_preprocessor=video)


# DeepSeek-VL (deepseek-community/deepseek-vl-*-chat): 576 (here 4) image tokens per image; the
# hybrid adds a SAM high-resolution tower whose features join in the aligner -------------------
_DEEPSEEK_BOS, _DEEPSEEK_EOS = (
    "<\uff5cbegin\u2581of\u2581sentence\uff5c>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>",
)
_DEEPSEEK_ROLES = {
    "bos_token": _DEEPSEEK_BOS,
    "eos_token": _DEEPSEEK_EOS,
    "pad_token": _DEEPSEEK_EOS,
    "image_token": "<image_placeholder>",
}
_DEEPSEEK_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- message['role'] | capitalize + ': ' -}}"
    + _content("<image_placeholder>")
    + "{{- '\\n\\n' if message['role'] == 'user' else eos_token -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'Assistant:' -}}{%- endif -%}"
)


def _deepseek_text(tok: Any, vocab: int) -> dict[str, Any]:
    t = tok.convert_tokens_to_ids
    return dict(
        _TEXT,
        model_type="llama",
        vocab_size=vocab,
        bos_token_id=t(_DEEPSEEK_BOS),
        eos_token_id=t(_DEEPSEEK_EOS),
        pad_token_id=t(_DEEPSEEK_EOS),
        rms_norm_eps=1e-6,
    )


def _deepseek_preprocessor(image_type: str, processor_class: str, **extra: Any) -> dict:
    return {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_pad": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5] * 3,
        "image_processor_type": image_type,
        "image_std": [0.5] * 3,
        "min_size": 14,
        "processor_class": processor_class,
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"height": 28, "width": 28},
        **extra,
    }


def _deepseek_generation(tok: Any) -> dict[str, Any]:
    t = tok.convert_tokens_to_ids
    return {"bos_token_id": t(_DEEPSEEK_BOS), "eos_token_id": t(_DEEPSEEK_EOS)}


def _recipe_deepseek_vl(tok: Any, vocab: int) -> _Recipe:
    from transformers import DeepseekVLConfig

    config = DeepseekVLConfig(
        text_config=_deepseek_text(tok, vocab),
        vision_config=dict(
            _SMALL_VIT, model_type="siglip_vision_model", image_size=28, patch_size=14
        ),
        image_token_id=tok.convert_tokens_to_ids("<image_placeholder>"),
    )
    pre = _deepseek_preprocessor("DeepseekVLImageProcessor", "DeepseekVLProcessor")
    proc = {"num_image_tokens": 4, "processor_class": "DeepseekVLProcessor"}
    return _Recipe(config, "AutoModelForImageTextToText", _deepseek_generation(tok), pre, proc)


def _recipe_deepseek_vl_hybrid(tok: Any, vocab: int) -> _Recipe:
    from transformers import DeepseekVLHybridConfig

    sam = {
        "model_type": "sam_vision_model",
        "hidden_size": 32,
        "output_channels": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 64,
        "patch_size": 16,
        "window_size": 2,
        "global_attn_indexes": [1],
        "num_pos_feats": 16,
        "mlp_dim": 64,
    }
    config = DeepseekVLHybridConfig(
        text_config=_deepseek_text(tok, vocab),
        vision_config=dict(
            _SMALL_VIT, model_type="siglip_vision_model", image_size=28, patch_size=14
        ),
        high_res_vision_config=sam,
        image_token_id=tok.convert_tokens_to_ids("<image_placeholder>"),
    )
    pre = _deepseek_preprocessor(
        "DeepseekVLHybridImageProcessor",
        "DeepseekVLHybridProcessor",
        high_res_image_mean=_CLIP_MEAN,
        high_res_image_std=_CLIP_STD,
        high_res_resample=3,
        high_res_size={"height": 64, "width": 64},
    )
    proc = {"num_image_tokens": 4, "processor_class": "DeepseekVLHybridProcessor"}
    return _Recipe(config, "AutoModelForImageTextToText", _deepseek_generation(tok), pre, proc)


# DeepSeek-OCR-2 (the DeepSeek-VL2 design): local tiles + a global view + a learned view
# separator, one contiguous run per image; an MoE LM. Its vision tower has fixed learned queries
# (144 per 768-px tile, 256 per 1024-px view), so views keep those token counts at tiny scale:
# a 48-px tile and a 64-px view through a SAM stage with 1-px patches and a 4x downsample.
def _recipe_deepseek_ocr2(tok: Any, vocab: int) -> _Recipe:
    from transformers import DeepseekOcr2Config

    text = dict(
        _deepseek_text(tok, vocab),
        model_type="deepseek_ocr2_text",
        num_key_value_heads=4,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        mlp_layer_types=["dense", "sparse"],
    )
    sam = {  # windowed attention only: a global layer over 64x64 patches costs seconds here
        "hidden_size": 16,
        "output_channels": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": 64,
        "patch_size": 1,
        "window_size": 8,
        "global_attn_indexes": [],
        "mlp_dim": 32,
        "downsample_channels": [32, 64],
    }
    encoder = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 16,
    }
    config = DeepseekOcr2Config(
        text_config=text,
        vision_config={"sam_config": sam, "encoder_config": encoder},
        image_token_id=tok.convert_tokens_to_ids("<image>"),
    )
    pre = _deepseek_preprocessor(
        "DeepseekOcr2ImageProcessor",
        "DeepseekOcr2Processor",
        crop_to_patches=True,
        min_patches=2,
        max_patches=6,
        size={"height": 64, "width": 64},
        tile_size=48,
    )
    del pre["min_size"]
    proc = {"downsample_ratio": 4, "patch_size": 1, "processor_class": "DeepseekOcr2Processor"}
    return _Recipe(config, "AutoModelForImageTextToText", _deepseek_generation(tok), pre, proc)


# Aya Vision (CohereLabs/aya-vision-*): GotOCR2 tiles, each "TILE_k" + patch tokens, a global tile
# last, inside <|START_OF_IMG|>...<|END_OF_IMG|>; a Cohere2 LM (3:1 sliding, logit_scale) ---------
_COHERE_HEAD = ("<PAD>", "<UNK>", "<CLS>", "<SEP>", "<MASK_TOKEN>", "<BOS_TOKEN>", "<EOS_TOKEN>")
_AYA_TAIL = (
    "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>",
    "<|SYSTEM_TOKEN|>", "<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_PATCH|>",
    "<|IMG_LINE_BREAK|>", "TILE_GLOBAL", "<image>",
)  # fmt: skip
_AYA_ROLES = {
    "bos_token": "<BOS_TOKEN>",
    "eos_token": "<|END_OF_TURN_TOKEN|>",
    "pad_token": "<PAD>",
    "unk_token": "<UNK>",
}
_AYA_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- set role = 'CHATBOT' if message['role'] == 'assistant' else message['role'] | upper -%}"
    "{{- '<|START_OF_TURN_TOKEN|><|' + role + '_TOKEN|>' -}}"
    + _content("<image>")
    + "{{- '<|END_OF_TURN_TOKEN|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' -}}{%- endif -%}"
)


def _recipe_aya_vision(tok: Any, vocab: int) -> _Recipe:
    from transformers import AyaVisionConfig

    t = tok.convert_tokens_to_ids
    layer_types = ["sliding_attention"] * 3 + ["full_attention"]
    text = dict(
        _TEXT,
        model_type="cohere2",
        num_hidden_layers=4,
        layer_types=layer_types,
        sliding_window=16,
        vocab_size=vocab,
        logit_scale=0.25,
        bos_token_id=t("<BOS_TOKEN>"),
        eos_token_id=t("<|END_OF_TURN_TOKEN|>"),
        pad_token_id=t("<PAD>"),
    )
    config = AyaVisionConfig(
        text_config=text,
        vision_config=dict(
            _SMALL_VIT, model_type="siglip_vision_model", image_size=56, patch_size=14
        ),
        image_token_index=t("<|IMG_PATCH|>"),
        downsample_factor=2,
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
    )
    pre = {
        "crop_to_patches": False,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5] * 3,
        "image_processor_type": "GotOcr2ImageProcessor",
        "image_std": [0.5] * 3,
        "max_patches": 6,
        "min_patches": 1,
        "processor_class": "AyaVisionProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"height": 56, "width": 56},
    }
    proc = {
        "downsample_factor": 2,
        "img_size": 56,
        "patch_size": 14,
        "processor_class": "AyaVisionProcessor",
    }
    gen = {"bos_token_id": t("<BOS_TOKEN>"), "eos_token_id": t("<|END_OF_TURN_TOKEN|>")}
    return _Recipe(config, "AutoModelForImageTextToText", gen, pre, proc)


# Granite 4 Vision: LLaVA-NeXT tiling, window Q-Former downsamplers, image-token embeddings zero and
# projected features added before given decoder layers (deepstack + spatial offsets) -------------
def _recipe_granite4_vision(tok: Any, vocab: int) -> _Recipe:
    from transformers import Granite4VisionConfig

    t = tok.convert_tokens_to_ids
    text = _granite_text(tok, vocab, "granite4_vision_text", num_hidden_layers=4)
    pinpoints = [[56, 112], [112, 56], [112, 112]]
    config = Granite4VisionConfig(
        text_config=text,
        vision_config=_clip_vision(image_size=56),
        qformer_config={"num_hidden_layers": 1, "intermediate_size": 128},
        image_token_index=t("<image>"),
        image_grid_pinpoints=pinpoints,
        image_seq_length=4,
        downsample_rate="2/4",
        deepstack_layer_map=[[-2, 0], [-1, 1]],
        spatial_vision_layer=-1,
        spatial_target_layers=[2, 3],
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        projector_dropout=0.0,
    )
    pre = _anyres_preprocessor("Granite4VisionProcessor", _CLIP_MEAN, _CLIP_STD)
    pre.update(
        crop_size={"height": 56, "width": 56},
        image_grid_pinpoints=pinpoints,
        size={"shortest_edge": 56},
    )
    proc = {
        "downsample_rate": "2/4",
        "image_token": "<image>",
        "num_additional_image_tokens": 1,
        "patch_size": 14,
        "processor_class": "Granite4VisionProcessor",
        "vision_feature_select_strategy": "default",
    }
    gen = {"bos_token_id": t("<|end_of_text|>"), "eos_token_id": t("<|end_of_text|>")}
    return _Recipe(config, "AutoModelForImageTextToText", gen, pre, proc)


# Ovis2 (AIDC-AI/Ovis2-*-hf style): a visual tokenizer (softmax over a visual vocabulary, then an
# embedding table); indicator tokens around and between tiles take learned visual embeddings ----
_OVIS_INDICATORS = ("<IMG_START>", "<IMG_GRID>", "<IMG_COL>", "<IMG_ROW>", "<IMG_END>")


def _recipe_ovis2(tok: Any, vocab: int) -> _Recipe:
    from transformers import Ovis2Config

    t = tok.convert_tokens_to_ids
    vision = dict(
        _SMALL_VIT,
        image_size=56,
        patch_size=14,
        vocab_size=64,
        hidden_stride=2,
        num_visual_indicator_tokens=len(_OVIS_INDICATORS),
    )
    text = dict(_qwen_text(tok, vocab), model_type="qwen2")
    config = Ovis2Config(
        text_config=text,
        vision_config=vision,
        image_token_id=t("<IMG_ATOM>"),
        visual_indicator_token_ids=[t(x) for x in _OVIS_INDICATORS],
        vocab_size=vocab,
        hidden_size=text["hidden_size"],
    )
    pre = {
        "crop_to_patches": True,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": _CLIP_MEAN,
        "image_processor_type": "Ovis2ImageProcessor",
        "image_std": _CLIP_STD,
        "max_patches": 6,
        "min_patches": 1,
        "processor_class": "Ovis2Processor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"height": 56, "width": 56},
        "use_covering_area_grid": True,
    }
    proc = {"image_seq_length": 4, "processor_class": "Ovis2Processor"}
    return _Recipe(config, "AutoModelForImageTextToText", _qwen_generation(tok), pre, proc)


# Gemma 4: 5:1-style sliding / full layers whose head dims differ, the last layers reading the
# KV of earlier ones, per-layer inputs, keys as values on full layers, images bidirectional on
# the sliding layers; aspect-preserving patches pooled 3 x 3 into soft tokens --------------------
_GEMMA4_HEAD = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")
_GEMMA4_TAIL = (
    *("<|turn>", "<turn|>", "<|image>", "<image|>", "<|image|>", "<|video|>"),
    *("<|audio>", "<audio|>", "<|audio|>"),  # the processor requires them (audio is not served)
)
_GEMMA4_ROLES = {
    "pad_token": "<pad>",
    "eos_token": "<eos>",
    "bos_token": "<bos>",
    "unk_token": "<unk>",
    "mask_token": "<mask>",
    "boi_token": "<|image>",
    "eoi_token": "<image|>",
    "image_token": "<|image|>",
    "boa_token": "<|audio>",
    "eoa_token": "<audio|>",
    "audio_token": "<|audio|>",
}
_GEMMA4_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<|turn>' + role + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] | trim -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] in ('image', 'image_url') -%}{{- '<|image|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] | trim -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<turn|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|turn>model\\n' -}}{%- endif -%}"
)
_GEMMA4_LAYERS = ["sliding_attention", "sliding_attention", "full_attention"] * 2


def _recipe_gemma4(tok: Any, vocab: int) -> _Recipe:
    from transformers import Gemma4Config

    t = tok.convert_tokens_to_ids
    text = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=len(_GEMMA4_LAYERS),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=32,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        num_kv_shared_layers=2,
        hidden_size_per_layer_input=64,
        vocab_size_per_layer_input=vocab,
        layer_types=_GEMMA4_LAYERS,
        sliding_window=24,
        use_bidirectional_attention="vision",
        final_logit_softcapping=30.0,
        max_position_embeddings=4096,
        initializer_range=0.02,
        vocab_size=vocab,
        pad_token_id=t("<pad>"),
        eos_token_id=t("<eos>"),
        bos_token_id=t("<bos>"),
    )
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        patch_size=4,
        pooling_kernel_size=3,
        position_embedding_size=256,
    )
    config = Gemma4Config(
        text_config=text,
        vision_config=vision,
        audio_config=None,
        image_token_id=t("<|image|>"),
        boi_token_id=t("<|image>"),
        eoi_token_id=t("<image|>"),
        video_token_id=t("<|video|>"),
        initializer_range=0.02,
    )
    pre = {
        "image_processor_type": "Gemma4ImageProcessor",
        "processor_class": "Gemma4Processor",
        "do_convert_rgb": True,
        "do_normalize": False,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.0, 0.0, 0.0],
        "image_std": [1.0, 1.0, 1.0],
        "max_soft_tokens": 70,
        "patch_size": 4,
        "pooling_kernel_size": 3,
        "resample": 3,
        "rescale_factor": 1 / 255,
    }
    proc = {"image_seq_length": 70, "processor_class": "Gemma4Processor"}
    eos = [t("<eos>"), t("<turn|>")]
    gen = {"bos_token_id": t("<bos>"), "eos_token_id": eos, "pad_token_id": t("<pad>")}
    return _Recipe(config, "AutoModelForImageTextToText", gen, pre, proc)


# PaliGemma 2: SigLIP + Gemma 2; a prefix-LM (images, <bos>, the prompt and a newline attend both
# ways; the answer is causal), positions from 1; no chat template ------------------------------
_PALIGEMMA_HEAD = ("<pad>", "<eos>", "<bos>", "<unk>")
_PALIGEMMA_TAIL = (
    "<image>",
    *(f"<loc{i:0>4}>" for i in range(1024)),
    *(f"<seg{i:0>3}>" for i in range(128)),
)
_PALIGEMMA_ROLES = {
    "pad_token": "<pad>",
    "eos_token": "<eos>",
    "bos_token": "<bos>",
    "unk_token": "<unk>",
    "image_token": "<image>",
}


def _recipe_paligemma(tok: Any, vocab: int) -> _Recipe:
    from transformers import PaliGemmaConfig

    t = tok.convert_tokens_to_ids
    text = dict(
        _TEXT,
        model_type="gemma2",
        num_hidden_layers=3,
        head_dim=32,
        query_pre_attn_scalar=32,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        sliding_window=16,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
        initializer_range=0.02,
        vocab_size=vocab,
        pad_token_id=t("<pad>"),
        eos_token_id=t("<eos>"),
        bos_token_id=t("<bos>"),
    )
    vision = dict(_SMALL_VIT, image_size=32, patch_size=8, projection_dim=128)
    config = PaliGemmaConfig(
        text_config=text,
        vision_config=vision,
        image_token_index=t("<image>"),
        projection_dim=128,
        hidden_size=128,
    )
    pre = {
        "image_processor_type": "SiglipImageProcessor",
        "processor_class": "PaliGemmaProcessor",
        "do_convert_rgb": None,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "image_seq_length": 16,
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"height": 32, "width": 32},
    }
    gen = {"bos_token_id": t("<bos>"), "eos_token_id": t("<eos>"), "pad_token_id": t("<pad>")}
    return _Recipe(config, "AutoModelForImageTextToText", gen, pre, None)


# ShieldGemma 2 (google/shieldgemma-2-4b-it): Gemma 3 under its own model_type, an image and a
# safety policy per prompt (its chat template), answered Yes / No --------------------------------
_SHIELDGEMMA_HEAD = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")
_SHIELDGEMMA_TAIL = (
    "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>",
)  # fmt: skip
_SHIELDGEMMA_ROLES = {
    "pad_token": "<pad>",
    "eos_token": "<eos>",
    "bos_token": "<bos>",
    "unk_token": "<unk>",
    "mask_token": "<mask>",
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
    "image_token": "<image_soft_token>",
}
_SHIELDGEMMA_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<start_of_turn>' + role + '\\n' -}}"
    "{%- if role == 'user' -%}{{- 'You are a policy expert trying to help determine whether a "
    "generated or real image is in violation of the safety policy below.\\n\\n' -}}{%- endif -%}"
    "{%- if message['content'] is string -%}{{- message['content'] | trim -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] in ('image', 'image_url') -%}{{- '<start_of_image>' -}}"
    "{%- elif part['type'] == 'text' -%}"
    "{{- '\\n\\n<BEGIN_SAFETY_POLICY>\\n' + part['text'] | trim + '\\n</END_SAFETY_POLICY>' -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- if role == 'user' -%}{{- '\\n\\nDoes the image violate the above policy? Your Answer "
    "must start with \\'Yes\\' or \\'No\\'.' -}}{%- endif -%}"
    "{{- '<end_of_turn>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)


def _recipe_shieldgemma2(tok: Any, vocab: int) -> _Recipe:
    from transformers import ShieldGemma2Config

    from sglang.testing.tiny_models import _recipe_gemma3

    gemma3 = _recipe_gemma3(tok, vocab)
    data = gemma3.config.to_dict()
    keep = ("mm_tokens_per_image", "boi_token_index", "eoi_token_index", "image_token_index")
    config = ShieldGemma2Config(
        text_config=data["text_config"],
        vision_config=data["vision_config"],
        initializer_range=0.02,
        **{k: data[k] for k in keep},
    )
    pre = dict(gemma3.preprocessor, processor_class="ShieldGemma2Processor")
    proc = {
        "image_seq_length": 16,
        "policy_definitions": {"dangerous": "No Dangerous Content: nothing harmful."},
        "processor_class": "ShieldGemma2Processor",
    }
    return _Recipe(config, "AutoModelForImageTextToText", gemma3.generation, pre, proc)


# VipLlava (llava-hf/vip-llava-7b-hf): LLaVA 1.5 with several CLIP layers concatenated and a
# layer-normed projector; its "###Human: / ###Assistant:" template --------------------------------
_VIPLLAVA_TEMPLATE = (
    "{{- 'A chat between a curious human and an artificial intelligence assistant. The assistant "
    "gives helpful, detailed, and polite answers to the human\\'s questions.' -}}"
    "{%- for message in messages -%}"
    "{{- '###' + ('Human' if message['role'] == 'user' else 'Assistant') + ': ' -}}"
    + _content("<image>\\n")
    + "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '###Assistant:' -}}{%- endif -%}"
)


def _recipe_vipllava(tok: Any, vocab: int) -> _Recipe:
    from transformers import VipLlavaConfig

    from sglang.testing.tiny_models import _recipe_llava

    llava = _recipe_llava(tok, vocab)
    data = llava.config.to_dict()
    vision = dict(data["vision_config"], num_hidden_layers=3)
    config = VipLlavaConfig(
        text_config=data["text_config"],
        vision_config=vision,
        image_token_index=data["image_token_index"],
        image_seq_length=16,
        vision_feature_layer=[-2, -3, 1],
    )
    return _Recipe(
        config, "AutoModelForImageTextToText", llava.generation, llava.preprocessor, llava.processor
    )


# LightOnOCR (lightonai/LightOnOCR-1B-1025): Pixtral tower, patches merged 2 x 2, Qwen3 LM; one
# run of <|image_pad|> per image (no row breaks), Qwen's chat template --------------------------
_LIGHTON_ROLES = {
    **_QWEN_ROLES,
    "image_token": "<|image_pad|>",
    "image_break_token": "<|vision_pad|>",
    "image_end_token": "<|vision_end|>",
}


def _recipe_lighton_ocr(tok: Any, vocab: int) -> _Recipe:
    from transformers import LightOnOcrConfig

    vision = dict(_SMALL_VIT, model_type="pixtral", image_size=112, patch_size=14, head_dim=16)
    config = LightOnOcrConfig(
        text_config=_qwen_text(tok, vocab, model_type="qwen3", head_dim=32, sliding_window=None),
        vision_config=vision,
        image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
        spatial_merge_size=2,
    )
    pre = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": _CLIP_MEAN,
        "image_processor_type": "PixtralImageProcessor",
        "image_std": _CLIP_STD,
        "patch_size": 28,  # the merged patch: resized sizes are whole merged patches
        "processor_class": "LightOnOcrProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"longest_edge": 112},
    }
    proc = {"patch_size": 14, "processor_class": "LightOnOcrProcessor", "spatial_merge_size": 2}
    return _Recipe(config, "AutoModelForImageTextToText", _qwen_generation(tok), pre, proc)


# GOT-OCR 2.0 (stepfun-ai/GOT-OCR-2.0-hf): a SAM-style tower whose two stride-2 convolutions give
# 256 tokens per view (here a 64-px view of 1-px patches, windowed attention only), a Qwen2 LM;
# <img> + <imgpad> x 256 per view + </img>, in ChatML with GOT's system prompt -------------------
_GOT_SYSTEM = "You should follow the instructions carefully and explain your answers in detail."
_GOT_IMAGE = "<img><imgpad></img>"
_GOT_TEMPLATE = (
    "{{- '<|im_start|>system\\n" + _GOT_SYSTEM + "<|im_end|>' -}}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    + _content(_GOT_IMAGE + "\\n")
    + "{{- '<|im_end|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _recipe_got_ocr2(tok: Any, vocab: int) -> _Recipe:
    from transformers import GotOcr2Config

    vision = {
        "hidden_size": 16,
        "output_channels": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": 64,
        "patch_size": 1,
        "window_size": 8,
        "global_attn_indexes": [],
        "mlp_dim": 32,
        "initializer_range": 0.1,  # the default 1e-10 would make every image look the same
    }
    config = GotOcr2Config(
        text_config=dict(_qwen_text(tok, vocab), model_type="qwen2", tie_word_embeddings=True),
        vision_config=vision,
        image_token_index=tok.convert_tokens_to_ids("<imgpad>"),
        image_seq_length=256,
    )
    pre = {
        "crop_to_patches": False,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": _CLIP_MEAN,
        "image_processor_type": "GotOcr2ImageProcessor",
        "image_std": _CLIP_STD,
        "max_patches": 6,
        "min_patches": 1,
        "processor_class": "GotOcr2Processor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"height": 64, "width": 64},
    }
    proc = {"processor_class": "GotOcr2Processor"}
    return _Recipe(config, "AutoModelForImageTextToText", _qwen_generation(tok), pre, proc)


# Idefics2 (HuggingFaceM4/idefics2-8b): SigLIP-style tower at native aspect, a perceiver resampler
# to image_seq_len latents per view (4 crops + the image when splitting), a Mistral LM; each image
# <fake_token_around_image> + <image> run per view, fakes between and after -----------------------
def _recipe_idefics2(tok: Any, vocab: int) -> _Recipe:
    from transformers import Idefics2Config

    text = _llava_text(tok, vocab, "mistral", sliding_window=None, head_dim=32)
    text["eos_token_id"] = [tok.convert_tokens_to_ids(x) for x in ("</s>", "<end_of_utterance>")]
    perceiver = {
        "hidden_size": text["hidden_size"],
        "resampler_n_latents": 4,
        "resampler_depth": 1,
        "resampler_n_heads": 2,
        "resampler_head_dim": 16,
        "num_key_value_heads": 1,
    }
    config = Idefics2Config(
        text_config=text,
        vision_config=dict(_SMALL_VIT, image_size=56, patch_size=14),
        perceiver_config=perceiver,
        image_token_id=tok.convert_tokens_to_ids("<image>"),
    )
    pre = {
        "do_convert_rgb": True,
        "do_image_splitting": True,
        "do_normalize": True,
        "do_pad": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5] * 3,
        "image_processor_type": "Idefics2ImageProcessor",
        "image_std": [0.5] * 3,
        "processor_class": "Idefics2Processor",
        "resample": 2,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": 28, "longest_edge": 56},
    }
    proc = {"image_seq_len": 4, "processor_class": "Idefics2Processor"}
    gen = {"bos_token_id": text["bos_token_id"], "eos_token_id": text["eos_token_id"]}
    return _Recipe(config, "AutoModelForImageTextToText", gen, pre, proc)


# Granite-Docling (ibm-granite/granite-for-docling-500m, transformers granite_docling): page
# tiles with <row_i_col_j> tags around <image> runs and a <global-img> thumbnail (Idefics3 style),
# DeepStack features from inner vision layers, a Granite LM --------------------------------------
def _recipe_granite_docling(tok: Any, vocab: int) -> _Recipe:
    from transformers import GraniteDoclingConfig

    t = tok.convert_tokens_to_ids
    text = _granite_text(tok, vocab, "granite_docling_text", tie_word_embeddings=True)
    # 1/head_dim would keep the tiny model's attention near uniform, hardly position-dependent
    text["attention_multiplier"] = 0.25
    vision = dict(
        _SMALL_VIT,
        image_size=64,
        patch_size=16,
        out_hidden_size=text["hidden_size"],
        scale_factor=2,
        deepstack_visual_indexes=[0, 1],
        use_fine_route=True,
    )
    config = GraniteDoclingConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=t("<image>"),
        pad_token_id=t("<pad>"),
        tie_word_embeddings=True,
    )
    pre = {
        "crop_to_patches": True,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5] * 3,
        "image_processor_type": "GraniteDoclingImageProcessor",
        "image_std": [0.5] * 3,
        "max_patches": 6,
        "min_patches": 1,
        "processor_class": "GraniteDoclingProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"height": 64, "width": 64},
    }
    proc = {"image_seq_len": 4, "processor_class": "GraniteDoclingProcessor"}
    gen = {"bos_token_id": t("<|end_of_text|>"), "eos_token_id": t("<|end_of_text|>")}
    return _Recipe(config, "AutoModelForImageTextToText", gen, pre, proc)


# GLM-4.6V (transformers glm46v, and glmga under its own model_type): the GLM-4.1V text model and
# vision tower, its own processor and image processors (GLM's smart_resize); the GLM-4.1V layout --
def _recipe_glm46v_like(tok: Any, vocab: int, config_class: str, image_processor: str) -> _Recipe:
    import transformers

    glm4v = _recipe_glm4v(tok, vocab)
    data = glm4v.config.to_dict()
    ids = {k: v for k, v in data.items() if k.endswith("token_id")}
    config = getattr(transformers, config_class)(
        text_config=data["text_config"], vision_config=data["vision_config"], **ids
    )
    pre = dict(
        glm4v.preprocessor, image_processor_type=image_processor, processor_class="Glm46VProcessor"
    )
    proc = {"processor_class": "Glm46VProcessor"}
    return _Recipe(config, "AutoModelForImageTextToText", glm4v.generation, pre, proc)


def _recipe_glm46v(tok: Any, vocab: int) -> _Recipe:
    return _recipe_glm46v_like(tok, vocab, "Glm46VConfig", "Glm46VImageProcessor")


def _recipe_glmga(tok: Any, vocab: int) -> _Recipe:
    return _recipe_glm46v_like(tok, vocab, "GlmgaConfig", "GlmgaImageProcessor")


# GLM-4.5V (zai-org/GLM-4.5V, transformers glm4v_moe): the GLM-4.1V layout with an MoE LM (a dense
# first layer, shared and routed experts); GLM-OCR (zai-org/GLM-OCR): the same with its own dense LM
def _recipe_glm4v_moe(tok: Any, vocab: int) -> _Recipe:
    from transformers import Glm4vMoeConfig

    glm4v = _recipe_glm4v(tok, vocab)
    data = glm4v.config.to_dict()
    ids = {k: v for k, v in data.items() if k.endswith("token_id")}
    text = {k: v for k, v in data["text_config"].items() if k not in ("model_type", "layer_types")}
    text.update(
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        moe_intermediate_size=64,
        first_k_dense_replace=1,
    )
    vision = {k: v for k, v in data["vision_config"].items() if k != "model_type"}
    config = Glm4vMoeConfig(text_config=text, vision_config=vision, **ids)
    return _Recipe(
        config, "AutoModelForImageTextToText", glm4v.generation, glm4v.preprocessor, glm4v.processor
    )


def _recipe_glm_ocr(tok: Any, vocab: int) -> _Recipe:
    from transformers import GlmOcrConfig

    glm46v = _recipe_glm46v(tok, vocab)
    data = glm46v.config.to_dict()
    ids = {k: v for k, v in data.items() if k.endswith("token_id")}
    text = {k: v for k, v in data["text_config"].items() if k not in ("model_type", "layer_types")}
    vision = {k: v for k, v in data["vision_config"].items() if k != "model_type"}
    config = GlmOcrConfig(text_config=text, vision_config=vision, **ids)
    return _Recipe(
        config,
        "AutoModelForImageTextToText",
        glm46v.generation,
        glm46v.preprocessor,
        glm46v.processor,
    )


# Qianfan-OCR (baidu/Qianfan-OCR): the InternVL design (GotOCR2 tiles of 448, here 56, plus a
# thumbnail, pixel-shuffled) with a Qwen3 LM; prompts write <image>, expanded to <img> +
# <IMG_CONTEXT> run + </img> ---------------------------------------------------------------------
_QIANFAN_ROLES = {**_INTERNVL_ROLES, "image_token": "<image>"}
del _QIANFAN_ROLES["video_token"]


def _recipe_qianfan_ocr(tok: Any, vocab: int) -> _Recipe:
    from transformers import QianfanOCRConfig

    config = QianfanOCRConfig(
        text_config=_qwen_text(tok, vocab, model_type="qwen3", head_dim=32, sliding_window=None),
        vision_config=dict(_SMALL_VIT, image_size=[56, 56], patch_size=[14, 14]),
        image_token_id=tok.convert_tokens_to_ids("<IMG_CONTEXT>"),
        image_seq_length=4,
        downsample_ratio=0.5,
    )
    pre = {
        "crop_to_patches": False,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": _IMAGENET_MEAN,
        "image_processor_type": "GotOcr2ImageProcessor",
        "image_std": _IMAGENET_STD,
        "max_patches": 6,
        "min_patches": 1,
        "processor_class": "QianfanOCRProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"height": 56, "width": 56},
    }
    proc = {"image_seq_length": 4, "processor_class": "QianfanOCRProcessor"}
    return _Recipe(config, "AutoModelForImageTextToText", _qwen_generation(tok), pre, proc)


# Video-LLaVA (LanguageBind/Video-LLaVA-7B-hf), LLaVA-NeXT-Video (llava-hf/LLaVA-NeXT-Video-7B-hf):
# images as LLaVA 1.5 (center crop) and LLaVA-NeXT (anyres tiles), a Vicuna-style template; videos
# are not served ---------------------------------------------------------------------------------
_VICUNA_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- ('USER: ' if message['role'] == 'user' else 'ASSISTANT: ') -}}"
    + _content("<image>\\n")
    + "{{- ' ' if message['role'] == 'user' else eos_token -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'ASSISTANT:' -}}{%- endif -%}"
)
_VIDEO_LLAVA_ROLES = {**_LLAVA_ROLES, "image_token": "<image>", "video_token": "<video>"}


def _recipe_video_llava(tok: Any, vocab: int) -> _Recipe:
    from transformers import VideoLlavaConfig

    t = tok.convert_tokens_to_ids
    config = VideoLlavaConfig(
        text_config=_llava_text(tok, vocab, "llama"),
        vision_config=_clip_vision(image_size=56),
        image_token_index=t("<image>"),
        video_token_index=t("<video>"),
        image_seq_length=16,
        video_seq_length=8 * 17,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
    )
    pre = {
        "crop_size": {"height": 56, "width": 56},
        "do_center_crop": True,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": _CLIP_MEAN,
        "image_processor_type": "VideoLlavaImageProcessor",
        "image_std": _CLIP_STD,
        "processor_class": "VideoLlavaProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": 56},
    }
    proc = {
        "image_token": "<image>",
        "num_additional_image_tokens": 1,
        "patch_size": 14,
        "processor_class": "VideoLlavaProcessor",
        "video_token": "<video>",
        "vision_feature_select_strategy": "default",
    }
    return _Recipe(config, "AutoModelForImageTextToText", _llava_generation(tok), pre, proc)


def _recipe_llava_next_video(tok: Any, vocab: int) -> _Recipe:
    from transformers import LlavaNextVideoConfig

    t = tok.convert_tokens_to_ids
    config = LlavaNextVideoConfig(
        text_config=_llava_text(tok, vocab, "llama"),
        vision_config=_clip_vision(),
        image_token_index=t("<image>"),
        video_token_index=t("<video>"),
        image_grid_pinpoints=_ANYRES_PINPOINTS,
        image_seq_length=4,
        video_seq_length=1,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
    )
    pre = _anyres_preprocessor("LlavaNextVideoProcessor", _CLIP_MEAN, _CLIP_STD)
    proc = {
        "image_token": "<image>",
        "num_additional_image_tokens": 1,
        "patch_size": 14,
        "processor_class": "LlavaNextVideoProcessor",
        "video_token": "<video>",
        "vision_feature_select_strategy": "default",
    }
    return _Recipe(config, "AutoModelForImageTextToText", _llava_generation(tok), pre, proc)


# PaddleOCR-VL (PaddlePaddle/PaddleOCR-VL): a NaViT-style SigLIP tower at native resolution (its own
# smart_resize), 2 x 2 merged patches, an ERNIE-4.5 LM with M-RoPE ---------------------------------
_PADDLE_IMAGE = "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>"
_PADDLE_TAIL = (
    "<|begin_of_sentence|>", "<|end_of_sentence|>", "<|IMAGE_START|>", "<|IMAGE_PLACEHOLDER|>",
    "<|IMAGE_END|>", "<|video_pad|>", "<pad>",
)  # fmt: skip
_PADDLE_ROLES = {
    "bos_token": "<s>",
    "eos_token": "</s>",
    "pad_token": "<pad>",
    "unk_token": "<unk>",
    "image_token": "<|IMAGE_PLACEHOLDER|>",
}
_PADDLE_TEMPLATE = (
    "{{- '<|begin_of_sentence|>' -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{{- 'User: ' -}}"
    + _content(_PADDLE_IMAGE)
    + "{{- '\\n' -}}"
    "{%- elif message['role'] == 'assistant' -%}{{- 'Assistant: ' -}}"
    + _content("")
    + "{{- '<|end_of_sentence|>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'Assistant: ' -}}{%- endif -%}"
)


def _recipe_paddleocr_vl(tok: Any, vocab: int) -> _Recipe:
    from transformers import PaddleOCRVLConfig

    t = tok.convert_tokens_to_ids
    rope = {"rope_type": "default", "rope_theta": 500000.0, "mrope_section": [4, 6, 6]}
    text = dict(
        _llava_text(tok, vocab, "paddleocr_vl_text", head_dim=32, rope_parameters=rope),
        eos_token_id=[t("</s>"), t("<|end_of_sentence|>")],
        tie_word_embeddings=True,
    )
    vision = dict(
        _SMALL_VIT,
        image_size=56,
        patch_size=14,
        spatial_merge_size=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    config = PaddleOCRVLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=t("<|IMAGE_PLACEHOLDER|>"),
        video_token_id=t("<|video_pad|>"),
        vision_start_token_id=t("<|IMAGE_START|>"),
        vision_end_token_id=t("<|IMAGE_END|>"),
        tie_word_embeddings=True,
    )
    pre = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5] * 3,
        "image_processor_type": "PaddleOCRVLImageProcessor",
        "image_std": [0.5] * 3,
        "merge_size": 2,
        "patch_size": 14,
        "processor_class": "PaddleOCRVLProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": 56 * 56, "longest_edge": 112 * 112},
        "temporal_patch_size": 1,
    }
    gen = {"bos_token_id": text["bos_token_id"], "eos_token_id": text["eos_token_id"]}
    return _Recipe(config, "AutoModelForImageTextToText", gen, pre)


# Aria (rhymes-ai/Aria): an Idefics3 tower over a 490-px (or 980-px) padded view, a cross-attention
# projector to a fixed query count per view size, an MoE LM with shared experts; <fim_prefix> +
# <|img|> run + <fim_suffix> in ChatML. Tiny: 70-px patches (7 x 7 per 490-px view) to 8 queries;
# two routed experts, both taken (with 4 experts the tiny router's near-ties flip under bfloat16
# rounding: 5-token chunks of the int8 model land 2.6x past test_quantization's bound, 0 unchunked)
_ARIA_IMAGE = "<fim_prefix><|img|><fim_suffix>"


def _recipe_aria(tok: Any, vocab: int) -> _Recipe:
    from transformers import AriaConfig

    text = _qwen_text(
        tok,
        vocab,
        model_type="aria_text",
        head_dim=32,
        intermediate_size=64,
        moe_num_experts=2,
        moe_topk=2,
        moe_num_shared_experts=1,
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
    )
    vision = dict(_SMALL_VIT, model_type="idefics3_vision", image_size=490, patch_size=70)
    config = AriaConfig(
        text_config=text,
        vision_config=vision,
        image_token_index=tok.convert_tokens_to_ids("<|img|>"),
        projector_patch_to_query_dict={49: 8, 196: 16},
        initializer_range=0.1,  # the projector's; at 0.02 its queries attend near uniformly
    )
    pre = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "image_mean": [0.5] * 3,
        "image_processor_type": "AriaImageProcessor",
        "image_std": [0.5] * 3,
        "max_image_size": 490,
        "min_image_size": 70,
        "processor_class": "AriaProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "split_image": False,
    }
    proc = {"processor_class": "AriaProcessor", "size_conversion": {"490": 8, "980": 16}}
    return _Recipe(config, "AutoModelForImageTextToText", _qwen_generation(tok), pre, proc)


# EXAONE 4.5 (LGAI-EXAONE/EXAONE-4.5-33B): a Qwen2.5-VL-style tower (windowed blocks, grouped KV
# heads) with Qwen's grid layout, an EXAONE 4 LM (3 sliding-window layers to 1 global, plain
# positions); EXAONE's [|role|] ... [|endofturn|] template ---------------------------------------
_EXAONE_TAIL = (
    "[|system|]", "[|user|]", "[|assistant|]", "[|endofturn|]", "<|vision_start|>",
    "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",
)  # fmt: skip
_EXAONE_ROLES = {"bos_token": "[BOS]", "eos_token": "[|endofturn|]", "pad_token": "[PAD]"}
_EXAONE_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '[|' + message['role'] + '|]' -}}"
    + _content("<|vision_start|><|image_pad|><|vision_end|>")
    + "{{- '[|endofturn|]\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '[|assistant|]' -}}{%- endif -%}"
)


def _recipe_exaone4_5(tok: Any, vocab: int) -> _Recipe:
    from transformers import Exaone4_5_Config

    t = tok.convert_tokens_to_ids
    text = dict(
        _TEXT,
        model_type="exaone4",
        num_hidden_layers=4,
        head_dim=32,
        sliding_window=16,
        sliding_window_pattern=4,
        vocab_size=vocab,
        bos_token_id=t("[BOS]"),
        eos_token_id=t("[|endofturn|]"),
        pad_token_id=t("[PAD]"),
    )
    vision = dict(
        _QWEN_VISION,
        hidden_size=64,
        intermediate_size=128,
        num_key_value_heads=2,
        out_hidden_size=text["hidden_size"],
        patch_size=14,
        window_size=56,
        fullatt_block_indexes=[1],
    )
    config = Exaone4_5_Config(
        text_config=text,
        vision_config=vision,
        image_token_id=t("<|image_pad|>"),
        video_token_id=t("<|video_pad|>"),
    )
    pre = _qwen_preprocessor(14, "Exaone4_5_Processor", "Qwen2VLImageProcessor", legacy=False)
    gen = {"bos_token_id": t("[BOS]"), "eos_token_id": t("[|endofturn|]")}
    return _Recipe(config, "AutoModelForImageTextToText", gen, pre)


# HunYuan-VL (tencent/HunyuanOCR): a NaViT-style tower, 2 x 2 patches merged by convolution with a
# learned newline per row, the run wrapped by two more image tokens; XD-RoPE (4 rotary axes: text,
# width, height, image index); prompts write image start + image + image end tokens ---------------
_HY_BOS, _HY_EOS = (
    "<\uff5chy_begin\u2581of\u2581sentence\uff5c>",
    "<\uff5chy_place\u2581holder\u2581no\u25812\uff5c>",
)
_HY_USER, _HY_ASSISTANT = "<\uff5chy_User\uff5c>", "<\uff5chy_Assistant\uff5c>"
_HY_IMAGE_TOKENS = tuple(
    f"<\uff5chy_place\u2581holder\u2581no\u2581{i}\uff5c>" for i in (100, 101, 102, 103)
)
_HY_IMAGE = "".join(_HY_IMAGE_TOKENS[:3])  # start, image, end
_HY_ROLES = {
    "bos_token": _HY_BOS,
    "eos_token": _HY_EOS,
    "pad_token": "<\uff5chy_pad\uff5c>",
    "image_start_token": _HY_IMAGE_TOKENS[0],
    "image_token": _HY_IMAGE_TOKENS[1],
    "image_end_token": _HY_IMAGE_TOKENS[2],
}
_HY_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{{- '" + _HY_USER + "' -}}"
    "{%- elif message['role'] == 'assistant' -%}{{- '"
    + _HY_ASSISTANT
    + "' -}}{%- endif -%}"
    + _content(_HY_IMAGE)
    + "{%- if message['role'] == 'assistant' -%}{{- eos_token -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '" + _HY_ASSISTANT + "' -}}{%- endif -%}"
)


def _recipe_hunyuan_vl(tok: Any, vocab: int) -> _Recipe:
    from transformers import HunYuanVLConfig

    t = tok.convert_tokens_to_ids
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 4, 4, 4]}
    text = dict(
        _TEXT,
        head_dim=32,
        vocab_size=vocab,
        rope_parameters=rope,
        bos_token_id=t(_HY_BOS),
        eos_token_id=t(_HY_EOS),
        pad_token_id=t(_HY_ROLES["pad_token"]),
        tie_word_embeddings=True,
    )
    vision = dict(
        _SMALL_VIT,
        out_hidden_size=text["hidden_size"],
        patch_size=16,
        spatial_merge_size=2,
        max_image_size=128,
        min_image_size=64,
        initializer_range=0.05,  # images move the tiny LM's logprobs well past bfloat16 noise
    )
    config = HunYuanVLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=t(_HY_IMAGE_TOKENS[1]),
        im_start_id=t(_HY_IMAGE_TOKENS[0]),
        im_end_id=t(_HY_IMAGE_TOKENS[2]),
        im_newline_id=t(_HY_IMAGE_TOKENS[3]),
    )
    pre = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": _CLIP_MEAN,
        "image_processor_type": "HunYuanVLImageProcessor",
        "image_std": _CLIP_STD,
        "merge_size": 2,
        "patch_size": 16,
        "processor_class": "HunYuanVLProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": 64 * 64, "longest_edge": 128 * 128},
        "temporal_patch_size": 1,
    }
    gen = {"bos_token_id": t(_HY_BOS), "eos_token_id": t(_HY_EOS)}
    return _Recipe(config, "AutoModelForImageTextToText", gen, pre)


# Cosmos3 Reasoner (nvidia/Cosmos3-Nano, transformers cosmos3_omni): Qwen3-VL (deepstack, M-RoPE)
# under its own config; the generator, sound and action towers of the unified checkpoint are not
# loaded -----------------------------------------------------------------------------------------
def _recipe_cosmos3_omni(tok: Any, vocab: int) -> _Recipe:
    from transformers import Cosmos3OmniConfig

    from sglang.testing.tiny_models import _recipe_qwen3_vl

    qwen3_vl = _recipe_qwen3_vl(tok, vocab)
    data = qwen3_vl.config.to_dict()
    ids = {k: v for k, v in data.items() if k.endswith("token_id")}
    config = Cosmos3OmniConfig(
        text_config=data["text_config"], vision_config=data["vision_config"], **ids
    )
    return _Recipe(
        config, "AutoModelForImageTextToText", qwen3_vl.generation, qwen3_vl.preprocessor
    )


# Cohere Compass (CohereLabs/North-Micro-Vision-Instruct): the Qwen3-VL design (deepstack,
# interleaved M-RoPE) with a Cohere2 LM (3 sliding-window layers with rotary positions to 1 global
# layer without, logit_scale); Cohere's turn template ----------------------------------------------
_COMPASS_IMAGE = "<|VISION_START|><|IMAGE_PAD|><|VISION_END|>"
_COMPASS_TAIL = (
    *_AYA_TAIL[:5],
    "<|VISION_START|>",
    "<|VISION_END|>",
    "<|IMAGE_PAD|>",
    "<|VIDEO_PAD|>",
)
_COMPASS_TEMPLATE = _AYA_TEMPLATE.replace("<image>", _COMPASS_IMAGE)


def _recipe_cohere_compass(tok: Any, vocab: int) -> _Recipe:
    from transformers import CohereCompassConfig

    t = tok.convert_tokens_to_ids
    rope = dict(_QWEN3_ROPE)
    layer_types = ["sliding_attention"] * 3 + ["full_attention"]
    text = dict(
        _TEXT,
        num_hidden_layers=4,
        head_dim=32,
        layer_types=layer_types,
        sliding_window=16,
        rope_parameters={"sliding_attention": rope, "full_attention": None},
        logit_scale=0.25,
        vocab_size=vocab,
        bos_token_id=t("<BOS_TOKEN>"),
        eos_token_id=t("<|END_OF_TURN_TOKEN|>"),
        pad_token_id=t("<PAD>"),
    )
    config = CohereCompassConfig(
        text_config=text,
        vision_config=_QWEN3_VISION,
        image_token_id=t("<|IMAGE_PAD|>"),
        video_token_id=t("<|VIDEO_PAD|>"),
        vision_start_token_id=t("<|VISION_START|>"),
        vision_end_token_id=t("<|VISION_END|>"),
    )
    pre = _qwen_preprocessor(
        16, "CohereCompassProcessor", "CohereCompassImageProcessor", legacy=False
    )
    gen = {"bos_token_id": t("<BOS_TOKEN>"), "eos_token_id": t("<|END_OF_TURN_TOKEN|>")}
    return _Recipe(config, "AutoModelForImageTextToText", gen, pre)


# Cosmos3 Edge (nvidia/Cosmos3-Edge): a SigLIP2 tower over GLM-style resized images (16-px patches,
# 2 x 2 merged), a Llama-style LM (relu2 MLP) with M-RoPE; Qwen3-VL's processor -------------------
def _recipe_cosmos3_edge(tok: Any, vocab: int) -> _Recipe:
    from transformers import Cosmos3EdgeConfig

    rope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [6, 5, 5]}
    text = dict(_qwen_text(tok, vocab), head_dim=32, hidden_act="relu2", rope_parameters=rope)
    vision = dict(_SMALL_VIT, patch_size=16, num_patches=16, spatial_merge_size=2)
    config = Cosmos3EdgeConfig(
        text_config=text, vision_config=vision, projector_hidden_size=128, **_qwen_ids(tok)
    )
    pre = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5] * 3,
        "image_processor_type": "Cosmos3EdgeImageProcessor",
        "image_std": [0.5] * 3,
        "merge_size": 2,
        "patch_size": 16,
        "processor_class": "Cosmos3EdgeProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": 64 * 64, "longest_edge": 128 * 128},
        "temporal_patch_size": 1,
    }
    return _Recipe(config, "AutoModelForImageTextToText", _qwen_generation(tok), pre)


# Janus (deepseek-community/Janus-Pro-1B): DeepSeek-VL's layout (a SigLIP tower and a 2-layer
# aligner into a Llama LM, images padded to one square) plus a VQ image tokenizer and generation
# head, loaded but unused when generating text; <begin_of_image> + run + <end_of_image> ---------
_JANUS_ROLES = {
    **_DEEPSEEK_ROLES,
    "boi_token": "<begin_of_image>",
    "eoi_token": "<end_of_image>",
}
_JANUS_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|' + message['role'] | capitalize + '|>: ' -}}"
    + _content("<image_placeholder>\\n")
    + "{{- '\\n\\n' if message['role'] == 'user' else eos_token -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|Assistant|>:' -}}{%- endif -%}"
)


def _recipe_janus(tok: Any, vocab: int) -> _Recipe:
    from transformers import JanusConfig

    text = _deepseek_text(tok, vocab)
    vision = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "image_size": 32,
        "patch_size": 8,
        "projection_dim": text["hidden_size"],
        "num_image_tokens": 16,
    }
    vq = {
        "embed_dim": 8,
        "num_embeddings": 64,
        "latent_channels": 32,  # group norms of 32 groups
        "base_channels": 32,
        "channel_multiplier": [1, 2],
        "num_res_blocks": 1,
        "num_patches": 4,
        "projection_dim": text["hidden_size"],
        "image_token_embed_dim": text["hidden_size"],
    }
    config = JanusConfig(
        text_config=text,
        vision_config=vision,
        vq_config=vq,
        image_token_id=tok.convert_tokens_to_ids("<image_placeholder>"),
    )
    pre = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_pad": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": _CLIP_MEAN,
        "image_processor_type": "JanusImageProcessor",
        "image_std": _CLIP_STD,
        "min_size": 8,
        "processor_class": "JanusProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"height": 32, "width": 32},
    }
    proc = {"num_image_tokens": 16, "processor_class": "JanusProcessor"}
    return _Recipe(config, "AutoModelForImageTextToText", _deepseek_generation(tok), pre, proc)


# VideoLLaMA3 (lkhl/VideoLLaMA3-2B-Image-HF): a NaViT-style SigLIP tower at native resolution
# (Qwen's smart_resize, no merge for images), a Qwen2 LM with plain positions ---------------------
def _recipe_video_llama_3(tok: Any, vocab: int) -> _Recipe:
    from transformers import VideoLlama3Config

    vision = dict(_SMALL_VIT, patch_size=14)
    config = VideoLlama3Config(
        text_config=dict(_qwen_text(tok, vocab), model_type="qwen2"),
        vision_config=vision,
        image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
    )
    pre = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5] * 3,
        "image_processor_type": "VideoLlama3ImageProcessor",
        "image_std": [0.5] * 3,
        "merge_size": 1,
        "patch_size": 14,
        "processor_class": "VideoLlama3Processor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": 28 * 28, "longest_edge": 56 * 56},
        "temporal_patch_size": 1,
    }
    return _Recipe(config, "AutoModelForImageTextToText", _qwen_generation(tok), pre)


# HyperCLOVA X SEED vision (naver-hyperclovax/HyperCLOVAX-SEED-Think-32B layout, transformers
# hyperclovax_vision_v2): a Qwen2.5-VL tower and Qwen's grid, plain positions, a HyperCLOVA X LM
# (MuP multipliers; its logits are multiplied by logits_scaling) ----------------------------------
def _recipe_hyperclovax_vision_v2(tok: Any, vocab: int) -> _Recipe:
    from transformers import HyperCLOVAXVisionV2Config

    text = _qwen_text(
        tok,
        vocab,
        model_type="hyperclovax",
        head_dim=32,
        embedding_multiplier=2.0,
        residual_multiplier=0.5,
        logits_scaling=0.5,
    )
    vision = dict(
        _QWEN_VISION,
        hidden_size=64,
        intermediate_size=128,
        out_hidden_size=64,
        patch_size=14,
        window_size=56,
        fullatt_block_indexes=[1],
    )
    config = HyperCLOVAXVisionV2Config(
        text_config=text,
        vision_config=vision,
        image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
    )
    pre = _qwen_preprocessor(
        14, "HyperCLOVAXVisionV2Processor", "Qwen2VLImageProcessor", legacy=False
    )
    return _Recipe(config, "AutoModelForImageTextToText", _qwen_generation(tok), pre)


# ERNIE-4.5-VL (baidu/ERNIE-4.5-VL-28B-A3B-PT): a Qwen2-VL-style tower, an ERNIE-4.5 MoE LM whose
# image tokens (and their start / end tokens) go to vision experts, text tokens to text experts;
# M-RoPE; ERNIE's tokens and template (as PaddleOCR-VL's) ------------------------------------------
_ERNIE_VL_TAIL = (*_PADDLE_TAIL, "<|VIDEO_START|>", "<|VIDEO_END|>", "<|VIDEO_PLACEHOLDER|>")
_ERNIE_VL_ROLES = {
    **_PADDLE_ROLES,
    "image_start_token": "<|IMAGE_START|>",
    "image_end_token": "<|IMAGE_END|>",
    "video_token": "<|VIDEO_PLACEHOLDER|>",
    "video_start_token": "<|VIDEO_START|>",
    "video_end_token": "<|VIDEO_END|>",
}


def _recipe_ernie4_5_vl_moe(tok: Any, vocab: int) -> _Recipe:
    from transformers import Ernie4_5_VLMoeConfig

    t = tok.convert_tokens_to_ids
    rope = {"rope_type": "default", "rope_theta": 500000.0, "mrope_section": [6, 6, 4]}
    text = dict(
        _llava_text(tok, vocab, "ernie4_5_vl_moe_text", rope_parameters=rope),
        eos_token_id=[t("</s>"), t("<|end_of_sentence|>")],
        moe_intermediate_size=[64, 32],  # text experts, vision experts
        moe_k=2,
        moe_num_experts=2,  # both taken: with 4, router near-ties flip under bfloat16 (Aria's)
        moe_num_shared_experts=1,
        num_hidden_layers=3,  # a sparse layer before the last: image tokens' experts matter
        mlp_layer_types=["dense", "sparse", "sparse"],
        tie_word_embeddings=True,
    )
    vision = {
        "depth": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 4,
        "patch_size": 14,
        "spatial_merge_size": 2,
    }
    config = Ernie4_5_VLMoeConfig(
        text_config=text,
        vision_config=vision,
        image_start_token_id=t("<|IMAGE_START|>"),
        image_end_token_id=t("<|IMAGE_END|>"),
        image_token_id=t("<|IMAGE_PLACEHOLDER|>"),
        video_start_token_id=t("<|VIDEO_START|>"),
        video_end_token_id=t("<|VIDEO_END|>"),
        video_token_id=t("<|VIDEO_PLACEHOLDER|>"),
    )
    pre = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": _CLIP_MEAN,
        "image_processor_type": "Ernie4_5_VLMoeImageProcessor",
        "image_std": _CLIP_STD,
        "merge_size": 2,
        "patch_size": 14,
        "processor_class": "Ernie4_5_VLMoeProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": 56 * 56, "longest_edge": 112 * 112},
    }
    gen = {"bos_token_id": text["bos_token_id"], "eos_token_id": text["eos_token_id"]}
    return _Recipe(config, "AutoModelForImageTextToText", gen, pre)


# Qwen2.5-Omni thinker (Qwen/Qwen2.5-Omni-7B's thinker, transformers qwen2_5_omni_thinker), images
# only: a Qwen2.5-VL tower and grid, M-RoPE; its audio tower is built but not served ---------------
_OMNI_IMAGE = "<|vision_bos|><|IMAGE|><|vision_eos|>"
_OMNI_TAIL = (
    *_QWEN_SPECIALS, "<|IMAGE|>", "<|AUDIO|>", "<|VIDEO|>", "<|vision_bos|>", "<|vision_eos|>",
    "<|audio_bos|>", "<|audio_eos|>",
)  # fmt: skip
_OMNI_ROLES = {
    **_QWEN_ROLES,
    "image_token": "<|IMAGE|>",
    "audio_token": "<|AUDIO|>",
    "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
}


def _recipe_qwen2_5_omni_thinker(tok: Any, vocab: int) -> _Recipe:
    from transformers import Qwen2_5OmniThinkerConfig

    t = tok.convert_tokens_to_ids
    rope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 6, 6]}
    text = _qwen_text(tok, vocab, model_type="qwen2_5_omni_text", rope_parameters=rope)
    vision = dict(
        _QWEN_VISION,
        hidden_size=64,
        intermediate_size=128,
        out_hidden_size=text["hidden_size"],
        patch_size=14,
        window_size=56,
        fullatt_block_indexes=[1],
    )
    audio = {
        "num_mel_bins": 16,
        "encoder_layers": 1,
        "encoder_attention_heads": 2,
        "encoder_ffn_dim": 64,
        "d_model": 32,
        "output_dim": text["hidden_size"],
        "max_source_positions": 100,
        "n_window": 10,
    }
    config = Qwen2_5OmniThinkerConfig(
        text_config=text,
        vision_config=vision,
        audio_config=audio,
        image_token_index=t("<|IMAGE|>"),
        audio_token_index=t("<|AUDIO|>"),
        video_token_index=t("<|VIDEO|>"),
        audio_start_token_id=t("<|audio_bos|>"),
        audio_end_token_id=t("<|audio_eos|>"),
        user_token_id=t("<|im_start|>"),
        vision_start_token_id=t("<|vision_bos|>"),  # read by get_rope_index
        vision_end_token_id=t("<|vision_eos|>"),
    )
    pre = _qwen_preprocessor(14, "Qwen2_5OmniProcessor", "Qwen2VLImageProcessor", legacy=False)
    return _Recipe(config, "AutoModelForImageTextToText", _qwen_generation(tok), pre)


# Qwen3-Omni thinker (transformers qwen3_omni_moe_thinker), images only: a Qwen3-VL-style tower
# (deepstack), an MoE LM, M-RoPE; its audio tower is built but not served -----------------------
def _recipe_qwen3_omni_moe_thinker(tok: Any, vocab: int) -> _Recipe:
    from transformers import Qwen3OmniMoeThinkerConfig

    t = tok.convert_tokens_to_ids
    text = _qwen_text(
        tok,
        vocab,
        model_type="qwen3_omni_moe_text",
        head_dim=32,
        rope_parameters=_QWEN3_ROPE,
        # both experts taken: with 4, a router near-tie flips when the prompt shares its batch
        # (test_bf16's batch: 0.2 nats at one position, 14x HF's bfloat16 noise; 0 alone)
        num_experts=2,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        decoder_sparse_step=1,
    )
    vision = dict(_QWEN3_VISION, out_hidden_size=text["hidden_size"])
    audio = {
        "num_mel_bins": 16,
        "encoder_layers": 1,
        "encoder_attention_heads": 2,
        "encoder_ffn_dim": 64,
        "d_model": 32,
        "output_dim": text["hidden_size"],
        "max_source_positions": 100,
        "n_window": 10,
        "n_window_infer": 40,
        "conv_chunksize": 50,
        "downsample_hidden_size": 16,
    }
    config = Qwen3OmniMoeThinkerConfig(
        text_config=text,
        vision_config=vision,
        audio_config=audio,
        image_token_id=t("<|IMAGE|>"),
        audio_token_id=t("<|AUDIO|>"),
        video_token_id=t("<|VIDEO|>"),
        audio_start_token_id=t("<|audio_bos|>"),
        user_token_id=t("<|im_start|>"),
        vision_start_token_id=t("<|vision_bos|>"),  # read by get_rope_index
        vision_end_token_id=t("<|vision_eos|>"),
    )
    pre = _qwen_preprocessor(16, "Qwen3OmniMoeProcessor", "Qwen2VLImageProcessor", legacy=False)
    return _Recipe(config, "AutoModelForImageTextToText", _qwen_generation(tok), pre)


FAMILIES: dict[str, Family] = {
    "internvl": Family(
        _TokSpec(
            (),
            (*_QWEN_SPECIALS, "<img>", "</img>", "<IMG_CONTEXT>", "<video>"),
            _INTERNVL_ROLES,
            _chatml("<IMG_CONTEXT>\n", video_text="<video>\n"),
        ),
        _recipe_internvl,
        "<IMG_CONTEXT>",
        "<IMG_CONTEXT>",
    ),
    "llava_next": Family(
        _TokSpec(
            _LLAVA_HEAD,
            ("<image>", "<pad>"),
            {**_LLAVA_ROLES, "image_token": "<image>"},
            _MISTRAL_TEMPLATE,
            add_bos=True,
        ),
        _recipe_llava_next,
        "<image>",
        "<image>",
    ),
    "granite_vision": Family(
        _TokSpec((), _GRANITE_TAIL, _GRANITE_ROLES, _GRANITE_TEMPLATE),
        _recipe_granite_vision,
        "<image>",
        "<image>",
    ),
    "llava_onevision": Family(
        _TokSpec(
            (),
            (*_QWEN_SPECIALS, "<image>", "<video>"),
            {**_QWEN_ROLES, "image_token": "<image>", "video_token": "<video>"},
            _chatml("<image>\n", video_text="<video>\n"),
        ),
        _recipe_llava_onevision,
        "<image>",
        "<image>",
    ),
    "mistral3": Family(
        _TokSpec(
            _LLAVA_HEAD,
            (*_MISTRAL3_TAIL, "<pad>"),
            _LLAVA_ROLES,
            _MISTRAL3_TEMPLATE,
            add_bos=True,
        ),
        _recipe_mistral3,
        "[IMG]",
        "[IMG]",
    ),
    "idefics3": Family(
        _TokSpec(
            (),
            ("<|begin_of_text|>", "<|end_of_text|>", *_IDEFICS_TAIL, *_ROW_COL),
            {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"},
            _idefics_template("bos_token"),
            add_bos=True,
        ),
        _recipe_idefics3,
        "<image>",
        "<image>",
    ),
    "smolvlm": Family(
        _TokSpec(
            (),
            ("<|endoftext|>", "<|im_start|>", "<|im_end|>", *_IDEFICS_TAIL, *_ROW_COL),
            _SMOLVLM_ROLES,
            _idefics_template("'<|im_start|>'"),
        ),
        _recipe_smolvlm,
        "<image>",
        "<image>",
    ),
    "qwen3_vl_moe": Family(
        _TokSpec((), _QWEN_SPECIALS, _QWEN_ROLES, _qwen_template(None)),
        _recipe_qwen3_vl_moe,
        "<|vision_start|><|image_pad|><|vision_end|>",
        "<|image_pad|>",
    ),
    "glm4v": Family(
        _TokSpec(
            (),
            _GLM_SPECIALS,
            {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
            _GLM_TEMPLATE,
        ),
        _recipe_glm4v,
        _GLM_IMAGE,
        "<|image|>",
    ),
    "deepseek_vl": Family(
        _TokSpec(
            (),
            (_DEEPSEEK_BOS, _DEEPSEEK_EOS, "<image_placeholder>"),
            _DEEPSEEK_ROLES,
            _DEEPSEEK_TEMPLATE,
            add_bos=True,
        ),
        _recipe_deepseek_vl,
        "<image_placeholder>",
        "<image_placeholder>",
    ),
    "deepseek_vl_hybrid": Family(
        _TokSpec(
            (),
            (_DEEPSEEK_BOS, _DEEPSEEK_EOS, "<image_placeholder>"),
            _DEEPSEEK_ROLES,
            _DEEPSEEK_TEMPLATE,
            add_bos=True,
        ),
        _recipe_deepseek_vl_hybrid,
        "<image_placeholder>",
        "<image_placeholder>",
    ),
    "deepseek_ocr2": Family(
        _TokSpec(
            (),
            (_DEEPSEEK_BOS, _DEEPSEEK_EOS, "<image>"),
            {**_DEEPSEEK_ROLES, "image_token": "<image>"},
            _DEEPSEEK_TEMPLATE.replace("<image_placeholder>", "<image>\\n"),
            add_bos=True,
        ),
        _recipe_deepseek_ocr2,
        "<image>",
        "<image>",
    ),
    "aya_vision": Family(
        _TokSpec(_COHERE_HEAD, _AYA_TAIL, _AYA_ROLES, _AYA_TEMPLATE, add_bos=True),
        _recipe_aya_vision,
        "<image>",
        "<|IMG_PATCH|>",
    ),
    "granite4_vision": Family(
        _TokSpec((), _GRANITE_TAIL, _GRANITE_ROLES, _GRANITE_TEMPLATE),
        _recipe_granite4_vision,
        "<image>",
        "<image>",
    ),
    "ovis2": Family(
        _TokSpec(
            (),
            (*_QWEN_SPECIALS, "<image>", "<IMG_ATOM>", *_OVIS_INDICATORS),
            {**_QWEN_ROLES, "image_token": "<image>"},
            _chatml("<image>\\n"),
        ),
        _recipe_ovis2,
        "<image>",
        "<IMG_ATOM>",
    ),
    "gemma4": Family(
        _TokSpec(_GEMMA4_HEAD, _GEMMA4_TAIL, _GEMMA4_ROLES, _GEMMA4_TEMPLATE, add_bos=True),
        _recipe_gemma4,
        "<|image|>",
        "<|image|>",
    ),
    "paligemma": Family(
        _TokSpec(_PALIGEMMA_HEAD, _PALIGEMMA_TAIL, _PALIGEMMA_ROLES, ""),
        _recipe_paligemma,
        "<image>",
        "<image>",
    ),
    "shieldgemma2": Family(
        _TokSpec(
            _SHIELDGEMMA_HEAD,
            _SHIELDGEMMA_TAIL,
            _SHIELDGEMMA_ROLES,
            _SHIELDGEMMA_TEMPLATE,
            add_bos=True,
        ),
        _recipe_shieldgemma2,
        "<start_of_image>",
        "<image_soft_token>",
    ),
    "vipllava": Family(
        _TokSpec(
            ("<unk>", "<s>", "</s>"),
            ("<image>", "<pad>"),
            {**_LLAVA_ROLES, "image_token": "<image>"},
            _VIPLLAVA_TEMPLATE,
            add_bos=True,
        ),
        _recipe_vipllava,
        "<image>",
        "<image>",
    ),
    "lighton_ocr": Family(
        _TokSpec((), _QWEN_SPECIALS, _LIGHTON_ROLES, _chatml("<|image_pad|>", None)),
        _recipe_lighton_ocr,
        "<|image_pad|>",
        "<|image_pad|>",
    ),
    "got_ocr2": Family(
        _TokSpec((), (*_QWEN_SPECIALS, "<img>", "</img>", "<imgpad>"), _QWEN_ROLES, _GOT_TEMPLATE),
        _recipe_got_ocr2,
        _GOT_IMAGE,
        "<imgpad>",
    ),
    "idefics2": Family(
        _TokSpec(
            _LLAVA_HEAD,
            ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<pad>"),
            _LLAVA_ROLES,
            _idefics_template("''"),
            add_bos=True,
        ),
        _recipe_idefics2,
        "<image>",
        "<image>",
    ),
    "granite_docling": Family(
        _TokSpec(
            (),
            (*_GRANITE_TAIL, "<fake_token_around_image>", "<global-img>", *_ROW_COL),
            {**_GRANITE_ROLES, "image_token": "<image>"},
            _GRANITE_TEMPLATE,
        ),
        _recipe_granite_docling,
        "<image>",
        "<image>",
    ),
    "glm46v": Family(
        _TokSpec(
            (),
            _GLM_SPECIALS,
            {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
            _GLM_TEMPLATE,
        ),
        _recipe_glm46v,
        _GLM_IMAGE,
        "<|image|>",
    ),
    "glmga": Family(
        _TokSpec(
            (),
            _GLM_SPECIALS,
            {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
            _GLM_TEMPLATE,
        ),
        _recipe_glmga,
        _GLM_IMAGE,
        "<|image|>",
    ),
    "glm4v_moe": Family(
        _TokSpec(
            (),
            _GLM_SPECIALS,
            {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
            _GLM_TEMPLATE,
        ),
        _recipe_glm4v_moe,
        _GLM_IMAGE,
        "<|image|>",
    ),
    "glm_ocr": Family(
        _TokSpec(
            (),
            _GLM_SPECIALS,
            {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
            _GLM_TEMPLATE,
        ),
        _recipe_glm_ocr,
        _GLM_IMAGE,
        "<|image|>",
    ),
    "qianfan_ocr": Family(
        _TokSpec(
            (),
            (*_QWEN_SPECIALS, "<img>", "</img>", "<IMG_CONTEXT>", "<image>"),
            _QIANFAN_ROLES,
            _chatml("<image>\\n", None),
        ),
        _recipe_qianfan_ocr,
        "<image>",
        "<IMG_CONTEXT>",
    ),
    "video_llava": Family(
        _TokSpec(
            _LLAVA_HEAD,
            ("<image>", "<video>", "<pad>"),
            _VIDEO_LLAVA_ROLES,
            _VICUNA_TEMPLATE,
            add_bos=True,
        ),
        _recipe_video_llava,
        "<image>",
        "<image>",
    ),
    "llava_next_video": Family(
        _TokSpec(
            _LLAVA_HEAD,
            ("<image>", "<video>", "<pad>"),
            _VIDEO_LLAVA_ROLES,
            _VICUNA_TEMPLATE,
            add_bos=True,
        ),
        _recipe_llava_next_video,
        "<image>",
        "<image>",
    ),
    "paddleocr_vl": Family(
        _TokSpec(_LLAVA_HEAD, _PADDLE_TAIL, _PADDLE_ROLES, _PADDLE_TEMPLATE),
        _recipe_paddleocr_vl,
        _PADDLE_IMAGE,
        "<|IMAGE_PLACEHOLDER|>",
    ),
    "aria": Family(
        _TokSpec(
            (),
            (*_QWEN_SPECIALS, "<fim_prefix>", "<fim_suffix>", "<|img|>"),
            {**_QWEN_ROLES, "image_token": "<|img|>"},
            _chatml(_ARIA_IMAGE, None),
        ),
        _recipe_aria,
        _ARIA_IMAGE,
        "<|img|>",
    ),
    "exaone4_5": Family(
        _TokSpec(("[PAD]", "[BOS]", "[UNK]"), _EXAONE_TAIL, _EXAONE_ROLES, _EXAONE_TEMPLATE),
        _recipe_exaone4_5,
        "<|vision_start|><|image_pad|><|vision_end|>",
        "<|image_pad|>",
    ),
    "hunyuan_vl": Family(
        _TokSpec(
            (),
            (_HY_BOS, _HY_EOS, _HY_USER, _HY_ASSISTANT, _HY_ROLES["pad_token"], *_HY_IMAGE_TOKENS),
            _HY_ROLES,
            _HY_TEMPLATE,
        ),
        _recipe_hunyuan_vl,
        _HY_IMAGE,
        _HY_IMAGE_TOKENS[1],
    ),
    "cosmos3_omni": Family(
        _TokSpec((), _QWEN_SPECIALS, _QWEN_ROLES, _qwen_template(None)),
        _recipe_cosmos3_omni,
        "<|vision_start|><|image_pad|><|vision_end|>",
        "<|image_pad|>",
    ),
    "cohere_compass": Family(
        _TokSpec(_COHERE_HEAD, _COMPASS_TAIL, _AYA_ROLES, _COMPASS_TEMPLATE, add_bos=True),
        _recipe_cohere_compass,
        _COMPASS_IMAGE,
        "<|IMAGE_PAD|>",
    ),
    "cosmos3_edge": Family(
        _TokSpec((), _QWEN_SPECIALS, _QWEN_ROLES, _qwen_template(None)),
        _recipe_cosmos3_edge,
        "<|vision_start|><|image_pad|><|vision_end|>",
        "<|image_pad|>",
    ),
    "janus": Family(
        _TokSpec(
            (),
            (
                _DEEPSEEK_BOS,
                _DEEPSEEK_EOS,
                "<image_placeholder>",
                "<begin_of_image>",
                "<end_of_image>",
                "<|User|>",
                "<|Assistant|>",
            ),  # fmt: skip
            _JANUS_ROLES,
            _JANUS_TEMPLATE,
            add_bos=True,
        ),
        _recipe_janus,
        "<image_placeholder>",
        "<image_placeholder>",
    ),
    "video_llama_3": Family(
        _TokSpec((), _QWEN_SPECIALS, _QWEN_ROLES, _chatml("<|image_pad|>\\n", None)),
        _recipe_video_llama_3,
        "<|image_pad|>",
        "<|image_pad|>",
    ),
    "hyperclovax_vision_v2": Family(
        _TokSpec((), _QWEN_SPECIALS, _QWEN_ROLES, _qwen_template(None)),
        _recipe_hyperclovax_vision_v2,
        "<|vision_start|><|image_pad|><|vision_end|>",
        "<|image_pad|>",
    ),
    "ernie4_5_vl_moe": Family(
        _TokSpec(_LLAVA_HEAD, _ERNIE_VL_TAIL, _ERNIE_VL_ROLES, _PADDLE_TEMPLATE),
        _recipe_ernie4_5_vl_moe,
        _PADDLE_IMAGE,
        "<|IMAGE_PLACEHOLDER|>",
    ),
    "qwen2_5_omni_thinker": Family(
        _TokSpec((), _OMNI_TAIL, _OMNI_ROLES, _chatml(_OMNI_IMAGE)),
        _recipe_qwen2_5_omni_thinker,
        _OMNI_IMAGE,
        "<|IMAGE|>",
    ),
    "qwen3_omni_moe_thinker": Family(
        _TokSpec((), _OMNI_TAIL, _OMNI_ROLES, _chatml(_OMNI_IMAGE, None)),
        _recipe_qwen3_omni_moe_thinker,
        _OMNI_IMAGE,
        "<|IMAGE|>",
    ),
}
