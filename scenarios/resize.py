"""Driver-side resizing (MAX_SIDE): every image's longest side at most N px, aspect kept, before encoding.

Seed 001's gateway resizes pages to a longest side of 1024 px (about 35% less peak memory per request);
MAX_SIDE does the same on the driver, so a sweep `MAX_SIDE=0,1024` measures what it buys. Done once per
image set (on the master; its workers receive the resized set), never per request. An image already
within the limit is sent as it is (the same bytes). A resized image keeps its format (JPEG at quality 90;
a format Pillow cannot write becomes PNG), its name, weight and expected text, and the ground truth a
generated page carries inside it (`ocr_text`), so the server and the answer check still see it. Its bucket
stays the source's, so the per-bucket breakdown compares the same pages across settings.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass, replace

from PIL import Image, PngImagePlugin

from scenarios.errors import ScenarioError
from scenarios.images import ImageSet
from scenarios.item import ImageItem
from scenarios.pages import TEXT_KEY, read_ground_truth

MIN_SIDE_PX = 32  # below this a page holds nothing an OCR model could read
JPEG_QUALITY = 90


@dataclass(frozen=True)
class SizeChange:
    """One image of the set as it was read or drawn and as it is sent."""

    name: str
    bucket: str
    before_px: tuple[int, int]
    after_px: tuple[int, int]
    bytes_before: int
    bytes_after: int


def fit_within(width_px: int, height_px: int, max_side_px: int) -> tuple[int, int]:
    """The size with the longest side at most `max_side_px`, aspect kept (rounded, each side >= 1)."""
    longest = max(width_px, height_px)
    if max_side_px <= 0 or longest <= max_side_px:
        return width_px, height_px
    scale = max_side_px / longest
    if width_px >= height_px:
        return max_side_px, max(1, round(height_px * scale))
    return max(1, round(width_px * scale)), max_side_px


def resize_item(item: ImageItem, max_side_px: int) -> ImageItem:
    """`item` with its longest side at most `max_side_px` (module doc); the item itself when it fits."""
    size = fit_within(item.width_px, item.height_px, max_side_px)
    if size == (item.width_px, item.height_px):
        return item
    truth = read_ground_truth(item.data)
    try:
        with warnings.catch_warnings():  # the set was checked against its pixel limit when read
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(item.data)) as im:
                fmt = im.format or "PNG"
                image = _resizable(im).resize(size, Image.Resampling.LANCZOS)
    except (OSError, ValueError) as exc:
        raise ScenarioError(f"cannot resize {item.name} to MAX_SIDE={max_side_px} ({exc}); check the image") from None
    data, mime = _encode(image, fmt, truth)
    return replace(item, width_px=size[0], height_px=size[1], data=data, mime=mime)


def resize_image_set(image_set: ImageSet, max_side_px: int) -> tuple[ImageSet, tuple[SizeChange, ...]]:
    """Every image of the set resized (module doc), and each one's sizes before and after."""
    items = tuple(resize_item(item, max_side_px) for item in image_set.items)
    changes = tuple(
        SizeChange(
            name=new.name,
            bucket=old.bucket,
            before_px=(old.width_px, old.height_px),
            after_px=(new.width_px, new.height_px),
            bytes_before=len(old.data),
            bytes_after=len(new.data),
        )
        for old, new in zip(image_set.items, items, strict=True)
    )
    return ImageSet(image_set.scenario, items, image_set.weights), changes


def _resizable(im: Image.Image) -> Image.Image:
    """A mode Lanczos resampling takes (palette and 1-bit images are expanded)."""
    if im.mode in ("RGB", "RGBA", "L", "LA"):
        return im
    return im.convert("RGBA" if im.mode in ("PA", "P") and "transparency" in im.info else "RGB")


def _encode(image: Image.Image, fmt: str, truth: str | None) -> tuple[bytes, str]:
    out = io.BytesIO()
    if fmt == "JPEG":
        comment = {"comment": f"{TEXT_KEY}:{truth}".encode()} if truth is not None else {}
        image.convert("RGB").save(out, "JPEG", quality=JPEG_QUALITY, **comment)
        return out.getvalue(), "image/jpeg"
    info = PngImagePlugin.PngInfo()
    if truth is not None:
        info.add_text(TEXT_KEY, truth)
    if fmt != "PNG":
        try:
            image.save(out, fmt)
            return out.getvalue(), Image.MIME.get(fmt, "application/octet-stream")
        except (OSError, KeyError, ValueError):
            out = io.BytesIO()  # a format Pillow reads but cannot write: PNG
    image.save(out, "PNG", pnginfo=info, compress_level=3)
    return out.getvalue(), "image/png"
