"""Image inputs: formats, hashing, validation, and not decoding an image twice."""

from __future__ import annotations

import base64
import io

import pytest
from conftest import make_image
from PIL import Image

from sglang.srt.multimodal.image_io import (
    LOCAL_PATHS_OFF,
    NOT_AN_IMAGE_SOURCE,
    DecodedImageCache,
    ImageError,
    load_image,
)


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    make_image(seed, 40, 30).save(buf, format="PNG")
    return buf.getvalue()


def test_repeated_bytes_are_not_decoded_again() -> None:
    seen = DecodedImageCache()
    first = load_image(_png(1), seen=seen)
    again = load_image("data:image/png;base64," + base64.b64encode(_png(1)).decode(), seen=seen)
    assert first.image is not None and again.image is None
    assert again.hash == first.hash and again.size == first.size == (40, 30)
    assert again.pil().tobytes() == first.image.tobytes()


def test_invalid_images_are_rejected_and_not_remembered() -> None:
    seen = DecodedImageCache()
    broken = _png(2)[:50]
    for _ in range(2):
        with pytest.raises(ImageError, match="cannot decode"):
            load_image(broken, seen=seen)
    buf = io.BytesIO()
    Image.new("1", (9000, 9000)).save(buf, format="PNG")
    with pytest.raises(ImageError, match="exceeds the limit"):
        load_image(buf.getvalue(), seen=seen)


def test_local_paths_follow_the_allowed_directory(tmp_path) -> None:
    allowed, outside = tmp_path / "ok", tmp_path / "no"
    allowed.mkdir()
    outside.mkdir()
    (allowed / "a.png").write_bytes(_png(3))
    (outside / "b.png").write_bytes(_png(3))
    assert load_image(str(allowed / "a.png"), str(allowed)).size == (40, 30)
    assert load_image("file://" + str(allowed / "a.png"), str(allowed)).size == (40, 30)
    refused = [
        (str(outside / "b.png"), str(allowed)),  # exists, outside
        (str(outside / "missing.png"), str(allowed)),  # does not exist, outside
        (str(allowed / ".." / "no" / "b.png"), str(allowed)),  # escapes by ..
        (str(allowed / "missing.png"), str(allowed)),  # does not exist, inside
        (str(allowed), str(allowed)),  # a directory
        ("file://" + str(outside / "b.png"), str(allowed)),
    ]
    messages = set()
    for path, root in refused:
        with pytest.raises(ImageError) as info:
            load_image(path, root)
        messages.add(str(info.value))
    assert messages == {NOT_AN_IMAGE_SOURCE}  # nothing tells which paths exist
    for path in (str(allowed / "a.png"), "file://" + str(outside / "missing.png")):
        with pytest.raises(ImageError) as info:  # no local files at all: the flag is named
            load_image(path, None)
        assert (
            str(info.value) == LOCAL_PATHS_OFF and "--allowed-local-media-path" in LOCAL_PATHS_OFF
        )
    with pytest.raises(ImageError, match="scheme"):
        load_image("ftp://host/a.png")


def test_decode_errors_never_show_memory_addresses() -> None:
    for data in (b"not an image at all", _png(6)[:60], b"GIF89a" + b"\x00" * 20):
        with pytest.raises(ImageError) as info:
            load_image(data)
        assert "0x" not in str(info.value) and "object at" not in str(info.value)


def test_pil_and_bytes_hash_by_content() -> None:
    assert load_image(make_image(4)).hash == load_image(make_image(4)).hash
    assert load_image(make_image(4)).hash != load_image(make_image(5)).hash
    assert load_image(_png(4)).hash != load_image(_png(5)).hash
