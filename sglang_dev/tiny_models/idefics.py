"""Idefics2, Idefics3 and SmolVLM: image splitting into tiles (row / column tags), <image> runs."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    SMALL_VIT,
    TEXT,
    Family,
    Recipe,
    TokSpec,
)
from sglang_dev.tiny_models.llava import LLAVA_HEAD, LLAVA_ROLES, llava_text

# Idefics3 / SmolVLM: tiles with <row_i_col_j> tags around <image> runs, a global view last ------
ROW_COL = tuple(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7))
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


def _recipe_idefics3(tok: Any, vocab: int) -> Recipe:
    from transformers import Idefics3Config

    t = tok.convert_tokens_to_ids
    text = dict(
        TEXT,
        model_type="llama",
        vocab_size=vocab,
        bos_token_id=t("<|begin_of_text|>"),
        eos_token_id=[t("<|end_of_text|>"), t("<end_of_utterance>")],
        pad_token_id=t("<|end_of_text|>"),
        rms_norm_eps=1e-5,
    )
    config = Idefics3Config(
        text_config=text,
        vision_config=dict(SMALL_VIT, image_size=56, patch_size=14),
        image_token_id=t("<image>"),
        scale_factor=2,
    )
    pre = _idefics_preprocessor("Idefics3Processor", "Idefics3ImageProcessor", 56)
    proc = {"image_seq_len": 4, "processor_class": "Idefics3Processor"}
    gen = {"bos_token_id": t("<|begin_of_text|>"), "eos_token_id": text["eos_token_id"]}
    return Recipe(config, "AutoModelForImageTextToText", gen, pre, proc)


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


def _recipe_smolvlm(tok: Any, vocab: int) -> Recipe:
    from transformers import SmolVLMConfig

    t = tok.convert_tokens_to_ids
    text = dict(
        TEXT,
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
        vision_config=dict(SMALL_VIT, image_size=64, patch_size=16),
        image_token_id=t("<image>"),
        scale_factor=2,
        tie_word_embeddings=True,
    )
    pre = _idefics_preprocessor("SmolVLMProcessor", "SmolVLMImageProcessor", 64)
    proc = {"image_seq_len": 4, "processor_class": "SmolVLMProcessor"}
    gen = {"bos_token_id": t("<|im_start|>"), "eos_token_id": t("<end_of_utterance>")}
    return Recipe(config, "AutoModelForImageTextToText", gen, pre, proc)


# Idefics2 (HuggingFaceM4/idefics2-8b): SigLIP-style tower at native aspect, a perceiver resampler
# to image_seq_len latents per view (4 crops + the image when splitting), a Mistral LM; each image
# <fake_token_around_image> + <image> run per view, fakes between and after -----------------------
def _recipe_idefics2(tok: Any, vocab: int) -> Recipe:
    from transformers import Idefics2Config

    text = llava_text(tok, vocab, "mistral", sliding_window=None, head_dim=32)
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
        vision_config=dict(SMALL_VIT, image_size=56, patch_size=14),
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
    return Recipe(config, "AutoModelForImageTextToText", gen, pre, proc)


FAMILY_SPECS = (
    Family(
        "idefics3",
        TokSpec(
            (),
            ("<|begin_of_text|>", "<|end_of_text|>", *_IDEFICS_TAIL, *ROW_COL),
            {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"},
            _idefics_template("bos_token"),
            add_bos=True,
        ),
        _recipe_idefics3,
        "<image>",
        "<image>",
    ),
    Family(
        "smolvlm",
        TokSpec(
            (),
            ("<|endoftext|>", "<|im_start|>", "<|im_end|>", *_IDEFICS_TAIL, *ROW_COL),
            _SMOLVLM_ROLES,
            _idefics_template("'<|im_start|>'"),
        ),
        _recipe_smolvlm,
        "<image>",
        "<image>",
    ),
    Family(
        "idefics2",
        TokSpec(
            LLAVA_HEAD,
            ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<pad>"),
            LLAVA_ROLES,
            _idefics_template("''"),
            add_bos=True,
        ),
        _recipe_idefics2,
        "<image>",
        "<image>",
    ),
)
