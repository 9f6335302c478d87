"""MiniCPM-V 4.6 and 4.7: a SigLIP tower over the image and its slices, a Qwen3.5 LM."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    QWEN_IMAGE,
    QWEN_ROLES,
    Family,
    Recipe,
    TokSpec,
    qwen_generation,
    qwen_text,
)
from sglang_dev.tiny_models.qwen3_5 import (
    QWEN3_5_SPECIALS,
    QWEN3_5_TEMPLATE,
    QWEN3_5_TEXT,
    THINK_TOKENS,
)

# MiniCPM-V 4.6 (openbmb/MiniCPM-V-4.6): a SigLIP tower over the image and its slices (NaViT
# packing, a window-attention merger inside the tower and a 2 x 2 merger after it: 16x fewer
# tokens), a Qwen3.5 LM (Gated DeltaNet); each image <image_id>N</image_id> + <image> + run +
# </image>, then its slices' <slice> runs row by row -----------------------------------------------
_MINICPM_TOKENS = ("<image>", "</image>", "<slice>", "</slice>", "<image_id>", "</image_id>")
_MINICPM_ROLES = {
    **QWEN_ROLES,
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "image_start_token": "<image>",
    "image_end_token": "</image>",
    "slice_start_token": "<slice>",
    "slice_end_token": "</slice>",
    "image_id_start_token": "<image_id>",
    "image_id_end_token": "</image_id>",
}
_MINICPM_TEMPLATE = QWEN3_5_TEMPLATE.replace(QWEN_IMAGE, "<|image_pad|>\\n")


def _recipe_minicpmv4_6(tok: Any, vocab: int) -> Recipe:
    from transformers import MiniCPMV4_6Config

    text = qwen_text(tok, vocab, model_type="qwen3_5_text", **QWEN3_5_TEXT)
    vision = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "image_size": 112,
        "patch_size": 14,
    }
    config = MiniCPMV4_6Config(
        text_config=text,
        vision_config=vision,
        insert_layer_id=0,
        image_size=112,
        image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
    )
    pre = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "downsample_mode": "16x",
        "image_mean": [0.5] * 3,
        "image_processor_type": "MiniCPMV4_6ImageProcessor",
        "image_std": [0.5] * 3,
        "max_slice_nums": 4,
        "patch_size": 14,
        "processor_class": "MiniCPMV4_6Processor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "scale_resolution": 112,
        "slice_mode": True,
        "use_image_id": True,
    }
    return Recipe(config, "AutoModelForImageTextToText", qwen_generation(tok), pre)


# MiniCPM-V 4.7 (openbmb/MiniCPM-V-4.7-1B): MiniCPM-V 4.6 with canvas M-RoPE (image, slice and
# row-break markers pinned to the image canvas's corners and edges) ------------------------------
def _recipe_minicpmv4_7(tok: Any, vocab: int) -> Recipe:
    from transformers import MiniCPMV4_7Config

    v46 = _recipe_minicpmv4_6(tok, vocab)
    data = v46.config.to_dict()
    t = tok.convert_tokens_to_ids
    keep = ("insert_layer_id", "image_size", "image_token_id", "video_token_id")
    config = MiniCPMV4_7Config(
        text_config=data["text_config"],
        vision_config=data["vision_config"],
        image_start_id=t("<image>"),
        image_end_id=t("</image>"),
        slice_start_id=t("<slice>"),
        slice_end_id=t("</slice>"),
        newline_id=tok("\\n", add_special_tokens=False)["input_ids"][0],
        **{k: data[k] for k in keep},
    )
    pre = dict(v46.preprocessor, processor_class="MiniCPMV4_7Processor")
    return Recipe(config, "AutoModelForImageTextToText", v46.generation, pre)


FAMILY_SPECS = (
    Family(
        "minicpmv4_6",
        TokSpec(
            (),
            (*QWEN3_5_SPECIALS, *_MINICPM_TOKENS),
            _MINICPM_ROLES,
            _MINICPM_TEMPLATE,
            plain=THINK_TOKENS,
        ),
        _recipe_minicpmv4_6,
        "<|image_pad|>",
        "<|image_pad|>",
        hybrid=True,
    ),
    Family(
        "minicpmv4_7",
        TokSpec(
            (),
            (*QWEN3_5_SPECIALS, *_MINICPM_TOKENS),
            _MINICPM_ROLES,
            _MINICPM_TEMPLATE,
            plain=THINK_TOKENS,
        ),
        _recipe_minicpmv4_7,
        "<|image_pad|>",
        "<|image_pad|>",
        hybrid=True,
    ),
)
