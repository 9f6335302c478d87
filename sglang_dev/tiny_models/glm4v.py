"""GLM-4.1V and its relatives (GLM-4.6V, GLM-GA, GLM-4.5V MoE, GLM-OCR): one GLM layout."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    CLIP_MEAN,
    CLIP_STD,
    QWEN_VISION,
    TEXT,
    Family,
    Recipe,
    TokSpec,
    content_template,
)

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
    "{{- '<|' + message['role'] + '|>\\n' -}}"
    + content_template(_GLM_IMAGE, _GLM_VIDEO)
    + "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)


def _recipe_glm4v(tok: Any, vocab: int) -> Recipe:
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
        TEXT,
        vocab_size=vocab,
        rope_parameters=rope,
        eos_token_id=eos,
        pad_token_id=t("<|endoftext|>"),
    )
    vision = dict(
        QWEN_VISION,
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
        "image_mean": CLIP_MEAN,
        "image_processor_type": "Glm4vImageProcessor",
        "image_std": CLIP_STD,
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
    return Recipe(config, "AutoModelForImageTextToText", gen, pre, video_preprocessor=video)


# GLM-4.6V (transformers glm46v, and glmga under its own model_type): the GLM-4.1V text model and
# vision tower, its own processor and image processors (GLM's smart_resize); the GLM-4.1V layout --
def _recipe_glm46v_like(tok: Any, vocab: int, config_class: str, image_processor: str) -> Recipe:
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
    return Recipe(config, "AutoModelForImageTextToText", glm4v.generation, pre, proc)


def _recipe_glm46v(tok: Any, vocab: int) -> Recipe:
    return _recipe_glm46v_like(tok, vocab, "Glm46VConfig", "Glm46VImageProcessor")


def _recipe_glmga(tok: Any, vocab: int) -> Recipe:
    return _recipe_glm46v_like(tok, vocab, "GlmgaConfig", "GlmgaImageProcessor")


# GLM-4.5V (zai-org/GLM-4.5V, transformers glm4v_moe): the GLM-4.1V layout with an MoE LM (a dense
# first layer, shared and routed experts); GLM-OCR (zai-org/GLM-OCR): the same with its own dense LM
def _recipe_glm4v_moe(tok: Any, vocab: int) -> Recipe:
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
    return Recipe(
        config, "AutoModelForImageTextToText", glm4v.generation, glm4v.preprocessor, glm4v.processor
    )


def _recipe_glm_ocr(tok: Any, vocab: int) -> Recipe:
    from transformers import GlmOcrConfig

    glm46v = _recipe_glm46v(tok, vocab)
    data = glm46v.config.to_dict()
    ids = {k: v for k, v in data.items() if k.endswith("token_id")}
    text = {k: v for k, v in data["text_config"].items() if k not in ("model_type", "layer_types")}
    vision = {k: v for k, v in data["vision_config"].items() if k != "model_type"}
    config = GlmOcrConfig(text_config=text, vision_config=vision, **ids)
    return Recipe(
        config,
        "AutoModelForImageTextToText",
        glm46v.generation,
        glm46v.preprocessor,
        glm46v.processor,
    )


FAMILY_SPECS = (
    Family(
        "glm4v",
        TokSpec(
            (),
            _GLM_SPECIALS,
            {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
            _GLM_TEMPLATE,
        ),
        _recipe_glm4v,
        _GLM_IMAGE,
        "<|image|>",
        video=True,
    ),
    Family(
        "glm46v",
        TokSpec(
            (),
            _GLM_SPECIALS,
            {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
            _GLM_TEMPLATE,
        ),
        _recipe_glm46v,
        _GLM_IMAGE,
        "<|image|>",
    ),
    Family(
        "glmga",
        TokSpec(
            (),
            _GLM_SPECIALS,
            {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
            _GLM_TEMPLATE,
        ),
        _recipe_glmga,
        _GLM_IMAGE,
        "<|image|>",
    ),
    Family(
        "glm4v_moe",
        TokSpec(
            (),
            _GLM_SPECIALS,
            {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
            _GLM_TEMPLATE,
        ),
        _recipe_glm4v_moe,
        _GLM_IMAGE,
        "<|image|>",
    ),
    Family(
        "glm_ocr",
        TokSpec(
            (),
            _GLM_SPECIALS,
            {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
            _GLM_TEMPLATE,
        ),
        _recipe_glm_ocr,
        _GLM_IMAGE,
        "<|image|>",
    ),
)
