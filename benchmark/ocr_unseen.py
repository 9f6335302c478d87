"""A second text renderer, used only for held-out sets: text drawn the way the reader never saw.

It shares no drawing code, fonts, layouts or question wordings with ``benchmark.ocr_render``
(the training renderer), so a score on its sets measures reading rather than the training
renderer's habits:

- fonts: the URW base35 faces (Nimbus Sans / Roman / Mono, URW Gothic, Bookman, C059, P052),
  Cantarell and Caladea (Debian's ``fonts-urw-base35``, ``fonts-cantarell``,
  ``fonts-crosextra-caladea``), none of which the training renderer loads;
- text drawn 3x oversized on a transparent layer and reduced with a Lanczos filter, at a
  cap-to-descender size of 18-36 px, onto a canvas of any size (margins drawn at random, no
  28-px grid);
- backgrounds plain, gradients at any angle, value-noise textures or blurred colour blobs
  (photo-like); about a quarter of the texts light on dark;
- a tilt of up to 4 degrees (15 for irregular text), a slight perspective, pixel noise, blur and
  a JPEG round trip;
- made-up words from a syllable grammar (no word list), digit strings of 1 to 10 digits;
- questions in OCRBench's wording and in others of our own.

``sample(kind, rng)`` draws one: ``kind`` is ``words``, ``digits`` or one of OCRBench's ten
categories (``benchmark.ocrbench.CATEGORIES``); ``KINDS`` lists the sets ``ocrbench_synth``
writes from them.
"""

from __future__ import annotations

import functools
import io
import math
import random
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from benchmark.ocr_render import Sample
from benchmark.ocrbench import CATEGORIES

FONT_GLOBS = (  # (folder, file pattern)
    (Path("/usr/share/fonts/opentype/urw-base35"), "*.otf"),
    (Path("/usr/share/fonts/opentype/cantarell"), "*.otf"),
    (Path("/usr/share/fonts/truetype/crosextra"), "Caladea-*.ttf"),
)
# Symbols, dingbats, a calligraphic script and hairline weights: not text a reader is asked for.
_SKIPPED = ("D050000L", "StandardSymbolsPS", "Z003", "Cantarell-Thin", "Cantarell-Light")
PACKAGES = "fonts-urw-base35 fonts-cantarell fonts-crosextra-caladea"
OVERSAMPLE = 3
KINDS = ("words", "digits", "mix")

WORD_QUESTIONS = (
    "what is written in the image?",
    "Which word appears in this picture?",
    "Read the text shown here.",
    "What word is printed in the image?",
)
DIGIT_QUESTIONS = (
    "what is the number in the image?",
    "What number is shown in this picture?",
    "Read the digits in the image.",
    "Which number is printed here?",
)
_ONSETS = ("b", "br", "d", "dr", "f", "fl", "g", "gl", "h", "j", "k", "l", "m", "n", "p", "pl",
           "r", "s", "sk", "st", "t", "tr", "v", "w", "z", "ch", "sh", "th", "qu")  # fmt: skip
_NUCLEI = ("a", "e", "i", "o", "u", "ai", "ea", "ou", "y", "ee", "oa")
_CODAS = ("", "", "", "n", "m", "r", "l", "s", "t", "x", "nd", "rk", "st", "ng", "ck")
_KEYS = {  # a receipt's key, its question and a value drawer
    "Total": ("What is the total amount?", lambda r: f"{r.randint(2, 480)}.{r.randint(0, 99):02d}"),
    "Date": ("What is the date on the receipt?",
             lambda r: f"{r.randint(1, 12):02d}/{r.randint(1, 28):02d}/20{r.randint(10, 29)}"),
    "Phone": ("What is the phone number?",
              lambda r: f"{r.randint(200, 999)}-{r.randint(1000, 9999)}"),
    "Invoice": ("What is the invoice number?", lambda r: str(r.randint(10000, 999999))),
    "Store": ("What is the name of the store?", lambda r: made_up_word(r).upper()),
}  # fmt: skip


@functools.cache
def fonts() -> tuple[str, ...]:
    found = sorted(str(p) for folder, pattern in FONT_GLOBS for p in folder.glob(pattern)
                   if not p.stem.startswith(_SKIPPED))  # fmt: skip
    if len(found) < 20:
        raise FileNotFoundError(
            f"the second renderer draws with Debian's {PACKAGES} (run scripts/install_test_deps.sh)"
        )
    return tuple(found)


@functools.lru_cache(maxsize=256)
def _font(path: str, pixels: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(path, pixels)


def made_up_word(rng: random.Random) -> str:
    """A pronounceable word of 2-3 syllables that no list holds, in one of three cases."""
    word = "".join(rng.choice(_ONSETS) + rng.choice(_NUCLEI) + rng.choice(_CODAS)
                   for _ in range(rng.randint(1, 3)))[:10]  # fmt: skip
    case = rng.random()
    return word.upper() if case < 0.2 else word.title() if case < 0.5 else word


def _colours(rng: random.Random) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(ink, paper): dark on light three times in four, light on dark otherwise."""
    dark = tuple(rng.randint(0, 80) for _ in range(3))
    light = tuple(rng.randint(175, 255) for _ in range(3))
    return (light, dark) if rng.random() < 0.25 else (dark, light)


def _background(size: tuple[int, int], paper: tuple[int, ...], rng: random.Random) -> np.ndarray:
    """Plain, a gradient at any angle, value noise, or blurred blobs, around ``paper``."""
    w, h = size
    base = np.broadcast_to(np.array(paper, np.float32), (h, w, 3)).copy()
    style = rng.randrange(4)
    gen = np.random.default_rng(rng.getrandbits(32))
    if style == 1:
        angle = rng.uniform(0, 2 * math.pi)
        ys, xs = np.mgrid[0:h, 0:w]
        ramp = (xs * math.cos(angle) + ys * math.sin(angle)) / max(w, h)
        base += (ramp - ramp.mean())[..., None] * gen.uniform(-60, 60, 3)
    elif style == 2:
        coarse = gen.normal(0, 1, (max(2, h // 8), max(2, w // 8))).astype(np.float32)
        up = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BICUBIC))
        base += up[..., None] * rng.uniform(6, 18)
    elif style == 3:
        blobs = Image.new("RGB", (w, h), tuple(int(c) for c in paper))
        draw = ImageDraw.Draw(blobs)
        for _ in range(rng.randint(3, 8)):
            x, y, r = rng.randrange(w), rng.randrange(h), rng.randint(h // 3 + 2, h + w // 3)
            shade = tuple(int(np.clip(c + rng.randint(-50, 50), 0, 255)) for c in paper)
            draw.ellipse((x - r, y - r, x + r, y + r), fill=shade)
        base = np.asarray(blobs.filter(ImageFilter.GaussianBlur(rng.uniform(4, 10))), np.float32)
    return base


def _text_layer(text: str, path: str, pixels: int, stroke: int = 0) -> Image.Image:
    """``text`` as an alpha mask drawn ``OVERSAMPLE`` times larger and reduced with Lanczos."""
    big = _font(path, pixels * OVERSAMPLE)
    left, top, right, bottom = big.getbbox(text, anchor="ls", stroke_width=stroke * OVERSAMPLE)
    pad = 2 * OVERSAMPLE
    mask = Image.new("L", (right - left + 2 * pad, bottom - top + 2 * pad), 0)
    ImageDraw.Draw(mask).text((pad - left, pad - top), text, font=big, fill=255, anchor="ls",
                              stroke_width=stroke * OVERSAMPLE, stroke_fill=255)  # fmt: skip
    size = (max(1, mask.width // OVERSAMPLE), max(1, mask.height // OVERSAMPLE))
    return mask.resize(size, Image.LANCZOS)


def _tilt(mask: Image.Image, rng: random.Random, degrees: float) -> Image.Image:
    """The mask turned by up to ``degrees`` and given a slight perspective: each corner moved
    by up to a tenth of the height, the quad mapped back onto the rectangle."""
    mask = mask.rotate(rng.uniform(-degrees, degrees), Image.BILINEAR, expand=True)
    w, h = mask.size
    jitter = 0.1 * h
    pad = math.ceil(jitter)
    corners = [(0, 0), (w, 0), (w, h), (0, h)]
    moved = [(x + pad + rng.uniform(-jitter, jitter), y + pad + rng.uniform(-jitter, jitter))
             for x, y in corners]  # fmt: skip
    rows = []  # output (moved) point -> input corner, solved for the 8 coefficients
    for (u, v), (x, y) in zip(moved, corners):
        rows.append(([u, v, 1, 0, 0, 0, -x * u, -x * v], x))
        rows.append(([0, 0, 0, u, v, 1, -y * u, -y * v], y))
    a = np.array([r for r, _ in rows], np.float64)
    b = np.array([t for _, t in rows], np.float64)
    coeffs = tuple(np.linalg.solve(a, b))
    return mask.transform((w + 2 * pad, h + 2 * pad), Image.PERSPECTIVE, coeffs, Image.BILINEAR)


def _compose(
    masks: list[tuple[Image.Image, tuple[int, int]]],
    size: tuple[int, int],
    ink: tuple[int, ...],
    paper: tuple[int, ...],
    rng: random.Random,
) -> Image.Image:
    """Each mask laid at its offset in ink over a drawn background, then noise, blur and JPEG."""
    canvas = _background(size, paper, rng)
    alpha = np.zeros(canvas.shape[:2], np.float32)
    for mask, (x, y) in masks:
        region = alpha[y : y + mask.height, x : x + mask.width]
        m = np.asarray(mask, np.float32)[: region.shape[0], : region.shape[1]] / 255
        np.maximum(region, m, out=region)
    canvas = canvas * (1 - alpha[..., None]) + np.array(ink, np.float32) * alpha[..., None]
    gen = np.random.default_rng(rng.getrandbits(32))
    canvas += gen.normal(0, rng.uniform(0, 10), canvas.shape)
    img = Image.fromarray(np.clip(canvas, 0, 255).astype(np.uint8))
    if rng.random() < 0.35:
        img = img.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 0.9)))
    if rng.random() < 0.6:
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=rng.randint(40, 95))
        img = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    return img


def _line(text: str, rng: random.Random, degrees: float = 4.0, stroke: int = 0,
          colours: tuple | None = None) -> Image.Image:  # fmt: skip
    """One line of text on a canvas of its own size plus random margins."""
    mask = _tilt(_text_layer(text, rng.choice(fonts()), rng.randint(18, 36), stroke), rng, degrees)
    left, right = rng.randint(3, 40), rng.randint(3, 40)
    top, bottom = rng.randint(2, 24), rng.randint(2, 24)
    size = (mask.width + left + right, mask.height + top + bottom)
    ink, paper = colours or _colours(rng)
    return _compose([(mask, (left, top))], size, ink, paper, rng)


def _handwritten(text: str, rng: random.Random) -> Image.Image:
    """Letters laid one by one, each turned and lifted on its own."""
    path, pixels = rng.choice(fonts()), rng.randint(20, 32)
    letters = [_text_layer(c, path, pixels + rng.randint(-3, 3)).rotate(
        rng.uniform(-10, 10), Image.BILINEAR, expand=True) for c in text]  # fmt: skip
    height = max(m.height for m in letters) + 8
    x, placed = rng.randint(4, 20), []
    for m in letters:
        placed.append((m, (x, rng.randint(0, height - m.height))))
        x += m.width - rng.randint(1, 4)
    ink, paper = _colours(rng)
    size = (x + rng.randint(4, 20), height + rng.randint(4, 16))
    return _compose([(m, (px, py + 4)) for m, (px, py) in placed], size, ink, paper, rng)


def _block(lines: list[tuple[str, int]], rng: random.Random) -> Image.Image:
    """Left-aligned lines, each (text, pixels), in one face and ink, top to bottom."""
    path = rng.choice(fonts())
    masks, y, width = [], rng.randint(6, 18), 0
    left = rng.randint(6, 24)
    for text, pixels in lines:
        mask = _text_layer(text, path, pixels)
        masks.append((mask, (left, y)))
        y += mask.height + rng.randint(4, 10)
        width = max(width, mask.width)
    ink, paper = _colours(rng) if rng.random() < 0.5 else ((20, 20, 20), (250, 250, 245))
    return _compose(masks, (left + width + rng.randint(6, 30), y + rng.randint(4, 14)), ink,
                    paper, rng)  # fmt: skip


def _digits(rng: random.Random) -> str:
    return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 10)))


def _sign(rng: random.Random) -> Sample:
    """A made-up word on a bordered plate over a textured, photo-like scene."""
    text = made_up_word(rng).upper() if rng.random() < 0.5 else made_up_word(rng)
    ink, plate = _colours(rng)
    sign = _line(text, rng, 3.0, colours=(ink, plate))
    ImageDraw.Draw(sign).rectangle((0, 0, sign.width - 1, sign.height - 1), outline=ink, width=2)
    scene_size = (sign.width + rng.randint(16, 80), sign.height + rng.randint(16, 60))
    scene_paper = tuple(rng.randint(40, 220) for _ in range(3))
    scene = _compose([], scene_size, ink, scene_paper, rng)
    scene.paste(sign, (rng.randint(0, scene.width - sign.width),
                       rng.randint(0, scene.height - sign.height)))  # fmt: skip
    return Sample(scene, "What does the sign say?", text, CATEGORIES[6])


def _document(rng: random.Random) -> Sample:
    heading = made_up_word(rng).title()
    body = [" ".join(made_up_word(rng).lower() for _ in range(2)) for _ in range(2)]
    size = rng.randint(18, 24)
    image = _block([(heading, size + 6), *[(line, size) for line in body]], rng)
    pick = rng.randrange(3)
    if pick == 0:
        return Sample(image, "What is the heading of this document?", heading, CATEGORIES[7])
    ordinal = ("second", "third")[pick - 1]
    return Sample(image, f"What does the {ordinal} line say?", body[pick - 1], CATEGORIES[7])


def _receipt(rng: random.Random) -> Sample:
    keys = rng.sample(sorted(_KEYS), 3)
    values = [_KEYS[k][1](rng) for k in keys]
    size = rng.randint(18, 24)
    image = _block([(f"{k}  {v}", size) for k, v in zip(keys, values)], rng)
    pick = rng.randrange(3)
    return Sample(image, _KEYS[keys[pick]][0], values[pick], CATEGORIES[8])


def _formula(rng: random.Random) -> Sample:
    """``v^{n} op c`` with a raised exponent: LaTeX the answer."""
    var, n, op, c = rng.choice("xyzmn"), rng.randint(2, 9), rng.choice("+-="), rng.randint(1, 99)
    path, pixels = rng.choice(fonts()), rng.randint(22, 32)
    base, power = _text_layer(var, path, pixels), _text_layer(str(n), path, pixels * 3 // 5)
    tail = _text_layer(f"{op}{c}", path, pixels)
    lift = pixels // 3
    x0 = rng.randint(6, 20)
    tail_at = (x0 + base.width + power.width + 2, lift + base.height - tail.height)
    placed = [(base, (x0, lift)), (power, (x0 + base.width, 0)), (tail, tail_at)]
    ink, paper = _colours(rng)
    size = (placed[-1][1][0] + tail.width + rng.randint(6, 20), lift + base.height + 8)
    question = "Please write out the expression of the formula in the image using LaTeX format."
    return Sample(_compose(placed, size, ink, paper, rng), question, f"{var}^{{{n}}}{op}{c}",
                  CATEGORIES[9])  # fmt: skip


def sample(kind: str, rng: random.Random) -> Sample:
    """One sample of ``kind``: ``words``, ``digits`` or an OCRBench category."""
    if kind in ("words", CATEGORIES[0]):
        text = made_up_word(rng)
        return Sample(_line(text, rng), rng.choice(WORD_QUESTIONS), text, CATEGORIES[0])
    if kind in ("digits", CATEGORIES[4]):
        text = _digits(rng)
        return Sample(_line(text, rng), rng.choice(DIGIT_QUESTIONS), text, CATEGORIES[4])
    if kind == CATEGORIES[1]:
        text = made_up_word(rng)
        return Sample(_line(text, rng, 15.0), WORD_QUESTIONS[0], text, kind)
    if kind == CATEGORIES[2]:
        text = made_up_word(rng)
        return Sample(_line(text, rng, 6.0, stroke=1), WORD_QUESTIONS[0], text, kind)
    if kind == CATEGORIES[3]:
        text = made_up_word(rng).lower()
        return Sample(_handwritten(text, rng), WORD_QUESTIONS[0], text, kind)
    if kind == CATEGORIES[5]:
        text = "".join(rng.choice("bcdfghjklmnpqrstvwxz") for _ in range(rng.randint(3, 8)))
        return Sample(_line(text, rng), WORD_QUESTIONS[0], text, kind)
    drawers = {CATEGORIES[6]: _sign, CATEGORIES[7]: _document, CATEGORIES[8]: _receipt,
               CATEGORIES[9]: _formula}  # fmt: skip
    if kind not in drawers:
        raise ValueError(f"kind must be words, digits or an OCRBench category, got {kind!r}")
    return drawers[kind](rng)


def samples(kind: str, count: int, seed: int) -> list[Sample]:
    """``count`` samples of a set: ``words``, ``digits``, or ``mix`` (the ten categories in
    turn)."""
    if kind not in KINDS:
        raise ValueError(f"set must be one of {KINDS}, got {kind!r}")
    rng = random.Random(seed)
    kinds = CATEGORIES if kind == "mix" else (kind,)
    return [sample(kinds[i % len(kinds)], rng) for i in range(count)]
