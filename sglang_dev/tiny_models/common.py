"""The shared building blocks of the tiny model recipes (``sglang_dev.tiny_models``).

Tokenizer specs and the BPE trainer, Qwen's chat template and config pieces that many families
reuse, the ``Recipe`` a family's builder returns, the ``Family`` spec that registers it, and the
helpers of the builder and its cache (json writing, seeding, cache root, file lock).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BPE_VOCAB_SIZE = 1280  # trained BPE vocab (incl. 256 bytes + head specials); specials follow
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

CORPUS = """\
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


def qwen_template(default_system: str | None) -> str:
    """Qwen's ChatML template; ``default_system`` None: no implicit system turn."""
    if default_system is None:  # Qwen3-VL style: no implicit system turn
        return _QWEN_TEMPLATE.replace(" and DEFAULT_SYSTEM", " and false")
    template = _QWEN_TEMPLATE.replace(" and DEFAULT_SYSTEM", "")
    return template.replace("DEFAULT_SYSTEM", default_system)


QWEN_SPECIALS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
)  # fmt: skip


@dataclass(frozen=True)
class TokSpec:
    head: tuple[str, ...]  # special tokens at ids 0..len(head)-1
    tail: tuple[str, ...]  # special tokens appended after the BPE vocab
    roles: dict[str, str]  # tokenizer_config special-token attributes (bos_token, eos_token, ...)
    chat_template: str
    add_bos: bool = False  # the tokenizer prepends bos_token (post-processor in tokenizer.json)
    plain: tuple[str, ...] = ()  # added tokens that decoding keeps (not special), e.g. <think>


QWEN_ROLES = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
QWEN_SYSTEM = "You are a helpful assistant."


TEXT = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "initializer_range": 0.1,
}
VECTOR_NOISE = 0.2


@dataclass
class Recipe:
    """What a family's recipe returns: the model config and the files' contents."""

    config: Any
    auto_class: str  # "AutoModelForImageTextToText" | "AutoModelForCausalLM"
    generation: dict[str, Any]
    preprocessor: dict[str, Any] | None = None
    processor: dict[str, Any] | None = None
    video_preprocessor: dict[str, Any] | None = None  # video_preprocessor_config.json


@dataclass(frozen=True)
class Family:
    """One tiny family, as the registry knows it.

    ``recipe(tokenizer, vocab_size)`` gives the ``Recipe``; ``placeholder`` is what a prompt
    writes for one image and ``image_token`` the token whose embedding rows are the image's (both
    None for a text-only LM). ``video``: the folder has a video_preprocessor_config.json (the
    recipe's ``video_preprocessor``). ``small_vision``: the vision-tower overrides of the "small"
    size (None: the family has only "tiny"). ``base``: one of the first VLM families, checked at
    parity with HF (test_parity.py); ``hybrid``: linear-attention or convolution layers besides
    attention (test_qwen3_5.py)."""

    name: str
    tokenizer: TokSpec
    recipe: Callable[[Any, int], Recipe]
    placeholder: str | None = None
    image_token: str | None = None
    video: bool = False
    small_vision: dict[str, Any] | None = None
    base: bool = False
    hybrid: bool = False

    @property
    def vlm(self) -> bool:
        return self.placeholder is not None


def qwen_ids(tok: Any) -> dict[str, int]:
    """Qwen's image / video / vision start and end token ids, as config kwargs."""
    t = tok.convert_tokens_to_ids
    return {
        "image_token_id": t("<|image_pad|>"),
        "video_token_id": t("<|video_pad|>"),
        "vision_start_token_id": t("<|vision_start|>"),
        "vision_end_token_id": t("<|vision_end|>"),
    }


def qwen_generation(tok: Any) -> dict[str, Any]:
    """generation_config.json of the Qwen families (ChatML's <|im_end|> ends a turn)."""
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    eos = [tok.convert_tokens_to_ids("<|im_end|>"), eot]
    return {"bos_token_id": eot, "eos_token_id": eos, "pad_token_id": eot}


def qwen_text(tok: Any, vocab: int, **extra: Any) -> dict[str, Any]:
    """A tiny Qwen text config (``TEXT`` with Qwen's token ids) with ``extra`` overrides."""
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    return {**TEXT, "vocab_size": vocab, "bos_token_id": eot, "eos_token_id": eos, **extra}


QWEN_VISION = {
    "depth": 2,
    "num_heads": 4,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "initializer_range": 0.05,
}
QWEN3_VISION = dict(
    QWEN_VISION,
    hidden_size=64,
    intermediate_size=128,
    out_hidden_size=128,
    patch_size=16,
    num_position_embeddings=256,
    deepstack_visual_indexes=[0, 1],
)
QWEN3_ROPE = {
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
    mean, std = (CLIP_MEAN, CLIP_STD) if patch == 14 else ([0.5] * 3, [0.5] * 3)
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


def qwen_preprocessor(patch: int, processor_class: str, image_type: str, legacy: bool) -> dict:
    """preprocessor_config.json of a tiny Qwen-VL-style folder (``legacy``: min/max_pixels too)."""
    mean, std = (CLIP_MEAN, CLIP_STD) if patch == 14 else ([0.5] * 3, [0.5] * 3)
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


IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
SMALL_VIT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}


QWEN_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"  # what a Qwen prompt writes per image


def chatml_template(
    image_text: str, system: str | None = QWEN_SYSTEM, video_text: str | None = None
) -> str:
    """A Qwen-style ChatML template that writes ``image_text`` for every image part (and
    ``video_text`` for every video part)."""
    template = qwen_template(system)
    template = template.replace(QWEN_IMAGE, image_text)
    if video_text is not None:
        template = template.replace("<|vision_start|><|video_pad|><|vision_end|>", video_text)
    return template


def content_template(image_text: str, video_text: str | None = None) -> str:
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


def train_tokenizer(spec: TokSpec, corpus: str = CORPUS, vocab_size: int = BPE_VOCAB_SIZE) -> Any:
    """A byte-level BPE tokenizer trained on ``corpus`` (``vocab_size`` includes the 256 bytes and
    the head specials), with ``spec``'s special tokens, roles and chat template, as a
    ``PreTrainedTokenizerFast``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.trainers import BpeTrainer
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        show_progress=False,
        special_tokens=list(spec.head),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus.splitlines(keepends=True), trainer=trainer)
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


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def patch_json(path: Path, **updates: Any) -> None:
    write_json(path, {**json.loads(path.read_text()), **updates})


@contextlib.contextmanager
def quiet_progress_bars() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def torch_seed(seed: int) -> Iterator[None]:
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def cache_root() -> Path:
    """Where built tiny folders are cached: ``$SGLANG_CACHE_DIR/tiny-models``."""
    base = os.environ.get("SGLANG_CACHE_DIR") or Path.home() / ".cache" / "sglang"
    return Path(base) / "tiny-models"


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
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
