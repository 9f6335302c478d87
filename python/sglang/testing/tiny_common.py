"""Pieces shared by the tiny model recipes (``tiny_models`` and ``tiny_families``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_BPE_VOCAB_SIZE = 1280  # trained BPE vocab (incl. 256 bytes + head specials); specials follow
_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

_CORPUS = """\
The quick brown fox jumps over the lazy dog. A small model can still say hello to the world.
Once upon a time there was a little red house at the edge of a green forest. Every morning the
sun rose over the hills, and the birds began to sing in the tall trees. The children who lived in
the house liked to run to the river, where they watched the fish swim between the smooth stones.
What do you see in this picture? I see a cat sitting on a chair next to a window. The cat is
black and white, and it looks at a bird outside. There is a blue cup on the table and a book with
a yellow cover. The room is bright because it is a sunny day.
Describe the image in one sentence. The image shows a busy street in a large city at night, with
cars, buses, people walking on the sidewalk, and many shops with colorful lights.
Please answer the question. What is the capital of France? The capital of France is Paris. What is
two plus two? Two plus two is four. How many days are in a week? There are seven days in a week:
Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and Sunday. The months of the year are
January, February, March, April, May, June, July, August, September, October, November and December.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 20 42 100 256 1000 2024 3.14 1/2 50% #1 $5.
The system is a helpful assistant. The user asks a question and the assistant gives a short, clear
and honest answer. If the assistant does not know the answer, it says so and explains why.
Machine learning models learn patterns from data. A language model predicts the next token in a
sequence of text, and a vision language model also looks at images before it writes an answer.
Images are split into small patches, each patch becomes a vector, and the vectors are merged into
image tokens that the language model reads together with the text tokens of the prompt.
Red, orange, yellow, green, blue, indigo and violet are the colors of the rainbow. Black, white
and gray are not in the rainbow. A square has four sides, a triangle has three sides and a circle
has none.
She said: "Let's go to the market tomorrow!" He replied, "Sure, I'll bring the bags; we need apples,
bread, cheese, eggs, milk, rice and tea." They walked for ten minutes and arrived at nine o'clock.
Write a short poem about the sea. The sea is wide, the sea is deep; it sings the sailors all to
sleep. The waves come in, the waves go out, and that is what the sea is about.
def add(a, b):
    return a + b
for i in range(10): print(i * 2)
{"name": "tiny", "type": "model", "size": [64, 128], "ok": true}
ABCDEFGHIJKLMNOPQRSTUVWXYZ abcdefghijklmnopqrstuvwxyz 0123456789 .,;:!?'"()[]{}<>-_=+*/\\|@#$%^&~`
"""


# With ``tools``, the system turn lists them and explains the <tool_call> format (Qwen2.5 style);
# assistant tool calls and tool results render as Qwen does. Without tools the text is unchanged.
_QWEN_TOOLS = (
    "{{- '# Tools\\n\\nYou can call the functions below. Each line inside <tools></tools> is the "
    "JSON signature of one function:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nTo call one, reply with its name and a JSON object of arguments "
    'between tags:\\n<tool_call>\\n{"name": <function name>, "arguments": '
    "<arguments object>}\\n</tool_call><|im_end|>\\n' -}}"
)

_QWEN_TEMPLATE = (
    "{%- set image_count = namespace(value=0) -%}"
    "{%- if tools -%}{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}{{- messages[0]['content'] -}}"
    "{%- else -%}{%- for part in messages[0]['content'] -%}"
    "{%- if 'text' in part -%}{{- part['text'] -}}{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '\\n\\n' -}}"
    "{%- elif true and DEFAULT_SYSTEM -%}{{- 'DEFAULT_SYSTEM\\n\\n' -}}{%- endif -%}"
    + _QWEN_TOOLS
    + "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if tools and loop.first and message['role'] == 'system' -%}"
    "{%- elif message['role'] == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] -}}"
    "{{- '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{%- if loop.first and message['role'] != 'system' and not tools and DEFAULT_SYSTEM -%}"
    "{{- '<|im_start|>system\\nDEFAULT_SYSTEM<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- elif message['content'] -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] in ('image', 'image_url') or 'image' in part or 'image_url' in part -%}"
    "{%- set image_count.value = image_count.value + 1 -%}"
    "{%- if add_vision_id -%}{{- 'Picture ' + image_count.value|string + ': ' -}}{%- endif -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] in ('video', 'video_url') or 'video' in part -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif 'text' in part -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- for call in message['tool_calls'] or [] -%}"
    "{%- set fn = call['function'] -%}"
    "{{- ('\\n' if message['content'] or not loop.first else '') + '<tool_call>\\n' -}}"
    "{{- '{\"name\": ' + (fn['name'] | tojson) + ', \"arguments\": ' -}}"
    "{{- (fn['arguments'] if fn['arguments'] is string else fn['arguments'] | tojson) -}}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _qwen_template(default_system: str | None) -> str:
    if default_system is None:  # Qwen3-VL style: no implicit system turn
        return _QWEN_TEMPLATE.replace(" and DEFAULT_SYSTEM", " and false")
    template = _QWEN_TEMPLATE.replace(" and DEFAULT_SYSTEM", "")
    return template.replace("DEFAULT_SYSTEM", default_system)


_QWEN_SPECIALS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
)  # fmt: skip


@dataclass(frozen=True)
class _TokSpec:
    head: tuple[str, ...]  # special tokens at ids 0..len(head)-1
    tail: tuple[str, ...]  # special tokens appended after the BPE vocab
    roles: dict[str, str]  # tokenizer_config special-token attributes (bos_token, eos_token, ...)
    chat_template: str
    add_bos: bool = False  # the tokenizer prepends bos_token (post-processor in tokenizer.json)
    plain: tuple[str, ...] = ()  # added tokens that decoding keeps (not special), e.g. <think>


_QWEN_ROLES = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
_QWEN_SYSTEM = "You are a helpful assistant."


_TEXT = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "initializer_range": 0.1,
}
_VECTOR_NOISE = 0.2


@dataclass
class _Recipe:
    config: Any
    auto_class: str  # "AutoModelForImageTextToText" | "AutoModelForCausalLM"
    generation: dict[str, Any]
    preprocessor: dict[str, Any] | None = None
    processor: dict[str, Any] | None = None
    video_preprocessor: dict[str, Any] | None = None  # video_preprocessor_config.json


def _qwen_ids(tok: Any) -> dict[str, int]:
    t = tok.convert_tokens_to_ids
    return {
        "image_token_id": t("<|image_pad|>"),
        "video_token_id": t("<|video_pad|>"),
        "vision_start_token_id": t("<|vision_start|>"),
        "vision_end_token_id": t("<|vision_end|>"),
    }


def _qwen_generation(tok: Any) -> dict[str, Any]:
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    eos = [tok.convert_tokens_to_ids("<|im_end|>"), eot]
    return {"bos_token_id": eot, "eos_token_id": eos, "pad_token_id": eot}


def _qwen_text(tok: Any, vocab: int, **extra: Any) -> dict[str, Any]:
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    return {**_TEXT, "vocab_size": vocab, "bos_token_id": eot, "eos_token_id": eos, **extra}


_QWEN_VISION = {
    "depth": 2,
    "num_heads": 4,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "initializer_range": 0.05,
}
_QWEN3_VISION = dict(
    _QWEN_VISION,
    hidden_size=64,
    intermediate_size=128,
    out_hidden_size=128,
    patch_size=16,
    num_position_embeddings=256,
    deepstack_visual_indexes=[0, 1],
)
_QWEN3_ROPE = {
    "rope_type": "default",
    "rope_theta": 5000000.0,
    "mrope_section": [6, 5, 5],
    "mrope_interleaved": True,
}
_QWEN_MIN_PIXELS, _QWEN_MAX_PIXELS = 128 * 128, 256 * 256


_QWEN_VIDEO_MIN_PIXELS, _QWEN_VIDEO_MAX_PIXELS = 56 * 56, 112 * 112  # per frame, below images


# Qwen3-VL's bounds are on a whole clip's pixels (frames x height x width).
_QWEN3_VIDEO_MIN_PIXELS, _QWEN3_VIDEO_MAX_PIXELS = 32 * 32 * 2, 32 * 32 * 64


def qwen_video_preprocessor(patch: int = 14, processor_type: str = "Qwen2VLVideoProcessor") -> dict:
    """``video_preprocessor_config.json`` of a tiny Qwen-VL folder."""
    mean, std = (_CLIP_MEAN, _CLIP_STD) if patch == 14 else ([0.5] * 3, [0.5] * 3)
    qwen3 = processor_type.startswith("Qwen3")
    low, high = (
        (_QWEN3_VIDEO_MIN_PIXELS, _QWEN3_VIDEO_MAX_PIXELS)
        if qwen3
        else (_QWEN_VIDEO_MIN_PIXELS, _QWEN_VIDEO_MAX_PIXELS)
    )
    return {
        "size": {"shortest_edge": low, "longest_edge": high},
        "patch_size": patch,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": mean,
        "image_std": std,
        "fps": 2.0,
        "min_frames": 4,
        "max_frames": 768,
        "do_sample_frames": False,
        "cap_pixels_per_frame": False,
        "video_processor_type": processor_type,
    }


def _qwen_preprocessor(patch: int, processor_class: str, image_type: str, legacy: bool) -> dict:
    mean, std = (_CLIP_MEAN, _CLIP_STD) if patch == 14 else ([0.5] * 3, [0.5] * 3)
    pixels = {"min_pixels": _QWEN_MIN_PIXELS, "max_pixels": _QWEN_MAX_PIXELS} if legacy else {}
    return {
        **pixels,
        "size": {"shortest_edge": _QWEN_MIN_PIXELS, "longest_edge": _QWEN_MAX_PIXELS},
        "patch_size": patch,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": mean,
        "image_std": std,
        "image_processor_type": image_type,
        "processor_class": processor_class,
    }
