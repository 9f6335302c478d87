"""Rendered-text samples in OCRBench's ten categories: what the reader trains on and is scored on.

``render(category, rng, split)`` draws one sample: a Pillow image, OCRBench's question for the
category and the gold answer. The ``train`` and ``heldout`` splits use different fonts and font
sizes (and callers use different seeds), so a held-out set measures reading, not recall:

- training fonts: most DejaVu faces; held-out: three faces never seen in training
  (``HELDOUT_FONTS``); sizes are even in training and odd in held-out sets;
- the fonts are Debian's ``fonts-dejavu-core`` and ``fonts-dejavu-extra`` (the held-out faces
  are in the latter; rendering raises, naming the packages, without them: a set drawn with other
  fonts would not be the same set).

Images stay small (at most 112 x 336 pixels after the processor's resize: 48 image tokens), which
is what lets a reader be trained from scratch on two CPU cores.
"""

from __future__ import annotations

import functools
import math
import random
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from benchmark.ocrbench import CATEGORIES

FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
HELDOUT_FONTS = (
    "DejaVuSansCondensed-Bold",
    "DejaVuSerifCondensed-Italic",
    "DejaVuSansMono-Oblique",
)
_SKIPPED_FONTS = ("DejaVuMathTeXGyre", "DejaVuSans-ExtraLight")  # unlike any text to be read
SPLITS = ("train", "heldout")

RECOGNITION_QUESTION = "what is written in the image?"
WORDS = """
able about above act add after again air all also always and animal answer any apple area arm
art ask away baby back ball bank base bear bed begin bell best big bird black blue boat body
bone book box boy bread bring brown build busy buy cake call camp car card care carry cat
catch cell chair chart check child city class clean clear clock close cloud coat cold color
come cook cool copy corn cost count cover cow cross cup cut dance dark day deep desk dog door
down draw dream dress drink drive duck dust early earth east easy eat edge egg end enter even
face fact fair fall farm fast fat field fill find fine fire fish five flat floor flow flower
fly food foot form four free fresh friend frog front fruit full game garden gate gift girl give
glad glass gold good grass green ground group grow hair half hand happy hard hat head hear
heart heat help high hill hold home hope horse hot hour house ice idea inch iron island jump
keep key kind king kite lake lamp land large last late laugh lead leaf left leg letter light
like line lion list little long look love low lucky make man map mark market meat milk mind
money moon morning mother mouse move music name near neck nest never new next nice night nine
north nose note number ocean office oil open orange page paint paper park party pass pen
people pick piece pink place plan plant play point pool poor press print queen quick quiet
rain read ready red rest rice ride right ring river road rock roof room rope round rule run
safe salt sand save school sea seat seed seven shape ship shoe shop short show side sign silver
simple sing sister six size sky sleep slow small smile snow soft song sound south space speak
spring square star start station stone store story street strong sugar summer sun table tail
talk tall tea team ten tent test thin three tiger time tire today tooth top town toy train
tree truck true turn two uncle under up use valley very village voice wait walk wall warm wash
watch water wave west wet wheel white wide wild wind window winter wire wise wood word work
world write yard year yellow young zero zoo
""".split()
KEYS = ("TOTAL", "DATE", "SHOP", "TAX", "CASH", "ITEM", "TIME", "TEL")
_DARK = ((0, 0, 0), (20, 20, 80), (90, 10, 10), (10, 70, 20), (60, 60, 60))
_MAX_SIDE = 336
STRING_CHARS = string.ascii_letters + string.digits
GLYPH_CHARS = STRING_CHARS + ".:/"  # the characters whose positions a sample records
CELL = 28  # the pixels of one image token: a 14-px patch merged 2 x 2


@dataclass
class Sample:
    image: Image.Image
    question: str
    answer: str
    category: str
    # Where each character of the image is drawn: (x, y, character), the centre of its advance
    # box in the image's pixels (None for the formulas, whose exponent is raised).
    glyphs: list[tuple[float, float, str]] | None = None


@functools.cache
def fonts(split: str) -> tuple[str, ...]:
    """Font files of a split."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    files = sorted(p for p in FONT_DIR.glob("*.ttf") if p.stem not in _SKIPPED_FONTS)
    held = split == "heldout"
    found = tuple(str(p) for p in files if (p.stem in HELDOUT_FONTS) == held)
    if not found:
        raise FileNotFoundError(
            f"no {split} DejaVu fonts in {FONT_DIR}: the OCR sets are rendered with them "
            "(Debian: apt-get install fonts-dejavu-core fonts-dejavu-extra, or run "
            "scripts/install_test_deps.sh)"
        )
    return found


@functools.lru_cache(maxsize=512)
def _font(path: str, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(path, size)


def _pick_font(rng: random.Random, split: str, low: int = 19, high: int = 24) -> Any:
    size = rng.randrange(low, high + 1)
    size += (size % 2) if split == "train" else (1 - size % 2)  # even train, odd held-out
    return _font(rng.choice(fonts(split)), size)


def _word(rng: random.Random) -> str:
    word = rng.choice(WORDS)
    style = rng.random()
    return word.upper() if style < 0.15 else word.capitalize() if style < 0.35 else word


def _light(rng: random.Random) -> tuple[int, int, int]:
    return tuple(rng.randint(190, 255) for _ in range(3))  # type: ignore[return-value]


def _glyphs(text: str, font: Any, x: float, y: float) -> list[tuple[float, float, str]]:
    """The centres of ``text``'s characters drawn by ``font`` from ``x`` on a line centred at
    ``y`` (spaces and characters outside ``GLYPH_CHARS`` are left out)."""
    return [(x + font.getlength(text[:i]) + font.getlength(c) / 2, y, c)
            for i, c in enumerate(text) if c in GLYPH_CHARS]  # fmt: skip


def _text_image(
    text: str, font: Any, rng: random.Random, fg=None, bg=None, stroke: int = 0
) -> tuple[Image.Image, list[tuple[float, float, str]]]:
    """``text`` on a plain background: one row of ``CELL`` pixels (more if the glyphs are taller),
    the text at a random horizontal offset and a little off centre vertically; and its glyphs."""
    left, top, right, bottom = font.getbbox(text, stroke_width=stroke)
    height = _cells(bottom - top + 2)
    img = Image.new("RGB", (right - left + rng.randint(4, 20), height), bg or _light(rng))
    y = (height - (bottom - top)) // 2 + rng.randint(-1, 1)
    x = rng.randint(1, img.width - (right - left) - 1) - left
    ImageDraw.Draw(img).text(
        (x, y - top), text, font=font, fill=fg or rng.choice(_DARK), stroke_width=stroke,
        stroke_fill=(255, 255, 255) if stroke else None,
    )  # fmt: skip
    return img, _glyphs(text, font, x, height / 2)


def _lines_image(
    lines: list[str], fonts_: list[Any], rng: random.Random, indent: bool = False
) -> tuple[Image.Image, list[tuple[float, float, str]]]:
    """One line per row of ``CELL`` pixels; and the lines' glyphs."""
    boxes = [f.getbbox(line) for line, f in zip(lines, fonts_)]
    width = max(b[2] - b[0] for b in boxes) + 2 * rng.randint(3, 10)
    img = Image.new("RGB", (width, CELL * len(lines)), _light(rng))
    draw, fg = ImageDraw.Draw(img), rng.choice(_DARK)
    glyphs = []
    for row, (line, f, b) in enumerate(zip(lines, fonts_, boxes)):
        x = (width - (b[2] - b[0])) // 2 if not indent else rng.randint(2, 6)
        y = row * CELL + (CELL - (b[3] - b[1])) // 2
        draw.text((x - b[0], y - b[1]), line, font=f, fill=fg)
        glyphs += _glyphs(line, f, x - b[0], row * CELL + CELL / 2)
    return img, glyphs


def _noise(img: Image.Image, rng: random.Random, amount: float) -> Image.Image:
    """Seeded Gaussian pixel noise, and sometimes a light blur."""
    if amount > 0:
        gen = np.random.default_rng(rng.getrandbits(32))
        pixels = np.asarray(img, dtype=np.float32)
        pixels = pixels + gen.normal(0.0, 30.0 * amount * rng.random(), pixels.shape)
        img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    if rng.random() < 0.3:
        img = img.filter(ImageFilter.GaussianBlur(rng.uniform(0.2, 0.7)))
    return img


def _cells(pixels: int) -> int:
    return max(1, -(-pixels // CELL)) * CELL


def _fit(sample: Sample) -> Sample:
    """The image scaled down to at most ``_MAX_SIDE`` x 4 rows, then padded with its corner's
    colour to whole ``CELL`` x ``CELL`` cells (at least two across), so the processor resizes
    nothing and every image token covers one cell of the rendering; the glyphs moved with it."""
    img = sample.image if sample.image.mode == "RGB" else sample.image.convert("RGB")
    scale = min(1.0, _MAX_SIDE / img.width, 4 * CELL / img.height)
    if scale < 1.0:
        img = img.resize((max(1, int(img.width * scale)), max(1, int(img.height * scale))))
    width, height = max(2 * CELL, _cells(img.width)), _cells(img.height)
    left, top = (width - img.width) // 2, (height - img.height) // 2
    if (width, height) != img.size:
        canvas = Image.new("RGB", (width, height), img.getpixel((0, 0)))
        canvas.paste(img, (left, top))
        img = canvas
    sample.image = img
    if sample.glyphs is not None:
        sample.glyphs = [(x * scale + left, y * scale + top, c) for x, y, c in sample.glyphs]
    return sample


def _regular(rng: random.Random, split: str) -> Sample:
    text = _word(rng) if rng.random() < 0.7 else f"{_word(rng)} {_word(rng)}"
    img, glyphs = _text_image(text, _pick_font(rng, split), rng)
    return Sample(img, RECOGNITION_QUESTION, text, CATEGORIES[0], glyphs)


def _rotated(
    glyphs: list[tuple[float, float, str]], angle: float, size: tuple[int, int],
    rotated_size: tuple[int, int],
) -> list[tuple[float, float, str]]:  # fmt: skip
    """Where ``Image.rotate(angle, expand=True)`` takes points of an image of ``size``: it turns
    about the image's centre onto the centre of the ``rotated_size`` result."""
    turn = -math.radians(angle)
    cos, sin = math.cos(turn), math.sin(turn)
    (w, h), (rw, rh) = size, rotated_size
    return [(cos * (x - w / 2) - sin * (y - h / 2) + rw / 2,
             sin * (x - w / 2) + cos * (y - h / 2) + rh / 2, c) for x, y, c in glyphs]  # fmt: skip


def _skew(
    img: Image.Image, glyphs: list[tuple[float, float, str]], angle: float, shear: float
) -> tuple[Image.Image, list[tuple[float, float, str]]]:
    """``img`` turned by ``angle`` degrees (expanding) and sheared by ``shear``, filled with its
    corner's colour; and its glyphs moved with it."""
    bg, size = img.getpixel((0, 0)), img.size
    img = img.rotate(angle, resample=Image.BICUBIC, expand=True, fillcolor=bg)
    glyphs = _rotated(glyphs, angle, size, img.size)
    offset = -abs(shear) * img.height if shear > 0 else 0
    img = img.transform(
        (img.width + int(abs(shear) * img.height), img.height), Image.AFFINE,
        (1, shear, offset, 0, 1, 0), resample=Image.BICUBIC, fillcolor=bg,
    )  # fmt: skip
    return img, [(x - shear * y - offset, y, c) for x, y, c in glyphs]  # the inverse of the map


def _irregular(rng: random.Random, split: str) -> Sample:
    text = _word(rng)
    img, glyphs = _text_image(text, _pick_font(rng, split, 19, 23), rng)
    img, glyphs = _skew(img, glyphs, rng.uniform(-12, 12), rng.uniform(-0.3, 0.3))
    return Sample(_noise(img, rng, 0.5), RECOGNITION_QUESTION, text, CATEGORIES[1], glyphs)


def _artistic(rng: random.Random, split: str) -> Sample:
    text = _word(rng)
    bg = tuple(rng.randint(0, 255) for _ in range(3))
    lum = 0.3 * bg[0] + 0.6 * bg[1] + 0.1 * bg[2]
    fg = tuple(rng.randint(0, 90) for _ in range(3)) if lum > 128 else _light(rng)
    stroke = 1 if rng.random() < 0.3 else 0
    img, glyphs = _text_image(text, _pick_font(rng, split, 20, 24), rng, fg=fg, bg=bg,
                              stroke=stroke)  # fmt: skip
    return Sample(img, RECOGNITION_QUESTION, text, CATEGORIES[2], glyphs)


def _handwriting(rng: random.Random, split: str) -> Sample:
    """Letters placed one by one with jitter in height, size and baseline, like a hand."""
    text = rng.choice(WORDS)
    base = _pick_font(rng, split, 18, 22)
    path, size = base.path, base.size
    glyphs = [(c, _font(path, max(12, size + rng.randint(-2, 2)))) for c in text]
    width = sum(int(f.getlength(c)) + rng.randint(0, 2) for c, f in glyphs) + 16
    img = Image.new("RGB", (width, CELL), _light(rng))
    draw, x, fg = ImageDraw.Draw(img), 8, rng.choice(_DARK)
    centres = []
    for c, f in glyphs:
        draw.text((x, (CELL - size) // 2 - 2 + rng.randint(-2, 2)), c, font=f, fill=fg)
        centres += _glyphs(c, f, x, CELL / 2)
        x += int(f.getlength(c)) + rng.randint(0, 2)
    return Sample(_noise(img, rng, 0.3), RECOGNITION_QUESTION, text, CATEGORIES[3], centres)


def _digits(rng: random.Random, split: str) -> Sample:
    text = "".join(rng.choice(string.digits) for _ in range(rng.randint(3, 9)))
    img, glyphs = _text_image(text, _pick_font(rng, split), rng)
    return Sample(_noise(img, rng, 0.3), RECOGNITION_QUESTION, text, CATEGORIES[4], glyphs)


def _non_semantic(rng: random.Random, split: str) -> Sample:
    text = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 7)))
    img, glyphs = _text_image(text, _pick_font(rng, split), rng)
    return Sample(img, RECOGNITION_QUESTION, text, CATEGORIES[5], glyphs)


def _scene(rng: random.Random, split: str) -> Sample:
    """A word on a coloured sign over a noisy, gradient "scene"."""
    text = _word(rng).upper() if rng.random() < 0.5 else _word(rng)
    font = _pick_font(rng, split, 19, 23)
    sign, glyphs = _text_image(text, font, rng, fg=(255, 255, 255), bg=rng.choice(_DARK[1:]))
    width, height = sign.width + rng.randint(20, 60), sign.height + CELL
    top, bottom = _light(rng), tuple(rng.randint(60, 200) for _ in range(3))
    scene = Image.linear_gradient("L").resize((width, height)).convert("RGB")
    scene = Image.composite(Image.new("RGB", scene.size, bottom), Image.new("RGB", scene.size, top),
                            scene.convert("L"))  # fmt: skip
    x, y = rng.randint(0, width - sign.width), rng.choice((0, CELL))
    scene.paste(sign, (x, y))
    question = "What is written on the sign?"
    glyphs = [(gx + x, gy + y, c) for gx, gy, c in glyphs]
    return Sample(_noise(scene, rng, 0.6), question, text, CATEGORIES[6], glyphs)


def _document(rng: random.Random, split: str) -> Sample:
    """A title and two lines; asked for the title or for line 2 or 3."""
    lines = [_word(rng).capitalize()] + [
        f"{rng.choice(WORDS)} {rng.choice(WORDS)}" for _ in range(2)
    ]
    body = _pick_font(rng, split, 18, 21)
    title = _font(body.path, body.size + 2)
    img, glyphs = _lines_image(lines, [title, body, body], rng)
    index = rng.randrange(3)
    if index == 0:
        question, answer = "What is the title of this document?", lines[0]
    else:
        question, answer = f"What is written on line {index + 1}?", lines[index]
    return Sample(img, question, answer, CATEGORIES[7], glyphs)


def _receipt(rng: random.Random, split: str) -> Sample:
    """Key: value lines of a receipt; asked for one key's value."""
    keys = rng.sample(KEYS, 3)
    values = {
        "TOTAL": lambda: f"{rng.randint(1, 99)}.{rng.randint(0, 99):02d}",
        "TAX": lambda: f"{rng.randint(0, 9)}.{rng.randint(0, 99):02d}",
        "CASH": lambda: f"{rng.randint(1, 99)}.00",
        "DATE": lambda: f"{rng.randint(1, 28):02d}/{rng.randint(1, 12):02d}",
        "TIME": lambda: f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}",
        "TEL": lambda: "".join(rng.choice(string.digits) for _ in range(6)),
        "SHOP": lambda: rng.choice(WORDS).upper(),
        "ITEM": lambda: rng.choice(WORDS),
    }
    pairs = [(k, values[k]()) for k in keys]
    font = _pick_font(rng, split, 18, 21)
    img, glyphs = _lines_image([f"{k}: {v}" for k, v in pairs], [font] * 3, rng, indent=True)
    key, value = rng.choice(pairs)
    return Sample(img, f"What is the {key.lower()}?", value, CATEGORIES[8], glyphs)


def _expression(rng: random.Random, split: str) -> Sample:
    """``a op x^{n}`` drawn with a raised, smaller exponent; the answer is its LaTeX."""
    a, op, var, n = rng.randint(1, 9), rng.choice("+-="), rng.choice("xyzab"), rng.randint(2, 9)
    font = _pick_font(rng, split, 19, 23)
    small = _font(font.path, max(10, font.size * 6 // 10))
    head = f"{a}{op}{var}"
    head_w, sup_w = int(font.getlength(head)), int(small.getlength(str(n)))
    img = Image.new("RGB", (head_w + sup_w + 20, CELL), _light(rng))
    draw, fg = ImageDraw.Draw(img), rng.choice(_DARK)
    top = font.getbbox(head)[1]
    draw.text((8, CELL - 4 - font.size * 9 // 10 - top // 2), head, font=font, fill=fg)
    draw.text((8 + head_w + 1, -small.getbbox(str(n))[1] + 1), str(n), font=small, fill=fg)
    question = "Please write out the expression of the formula in the image using LaTeX format."
    return Sample(_noise(img, rng, 0.2), question, f"{a}{op}{var}^{{{n}}}", CATEGORIES[9])


_RENDERERS = (
    _regular, _irregular, _artistic, _handwriting, _digits, _non_semantic, _scene, _document,
    _receipt, _expression,
)  # fmt: skip


def render_string(rng: random.Random, length: int, split: str = "train") -> Sample:
    """A random string of ``length`` letters and digits on one line: the short strings the
    reader's training starts from (one character to find before many to read in order)."""
    text = "".join(rng.choice(STRING_CHARS) for _ in range(length))
    font = _pick_font(rng, split)
    left, top, right, bottom = font.getbbox(text)
    img = Image.new("RGB", (right - left + rng.randint(4, 20), CELL), _light(rng))
    x = rng.randint(1, img.width - (right - left) - 1) - left
    y = (CELL - (bottom - top)) // 2 + rng.randint(-1, 1) - top
    ImageDraw.Draw(img).text((x, y), text, font=font, fill=rng.choice(_DARK))
    glyphs = _glyphs(text, font, x, CELL / 2)
    return _fit(Sample(_noise(img, rng, 0.2), RECOGNITION_QUESTION, text, "chars", glyphs))


def render(category: str, rng: random.Random, split: str = "train") -> Sample:
    """One sample of ``category`` drawn from ``rng``."""
    return _fit(_RENDERERS[CATEGORIES.index(category)](rng, split))
