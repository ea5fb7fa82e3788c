"""Image sets per scenario: which images a run sends, and how often each.

Scenarios (`build_image_set`):
- `fixed`: one generated 1000x700 page (or `images` = one file): every step sees the same work.
- `mixed`: one generated page per size bucket, picked by weight; buckets text "WxH:weight,...",
  default DEFAULT_BUCKETS; a weight of 0 drops a bucket.
- `large`: a 1080x8000 receipt (PNG) and a 4000x3000 photo (JPEG, paper texture), equal weights.
- `folder`: every image in the folder `images` (see scenarios.files for expected texts); a PDF or TIFF
  there, or as `images` of the other scenarios, gives one image per page (scenarios.documents). A folder's
  images are grouped in bands of pixels (`band_by_pixels`: "WxH..WxH", or "WxH" for one size).
- `soak`, `retry`: the fixed image, or `images` (a file or a folder) when given.
`variants` > 1 generates that many different pages (seeds seed..seed+variants-1) per bucket, sharing the
bucket's weight, for servers that cache repeated images (e.g. vLLM's multimodal/prefix caches).
All generated sizes are checked against `max_pixels` before anything is drawn.
"""

from __future__ import annotations

import bisect
import itertools
import random
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from scenarios.documents import DocumentOptions, check_document_options
from scenarios.errors import ScenarioError
from scenarios.files import load_folder, load_path
from scenarios.item import ImageItem, bucket_of
from scenarios.pages import make_document_image

__all__ = [
    "DEFAULT_BUCKETS",
    "SCENARIOS",
    "Bucket",
    "ImageItem",
    "ImageSet",
    "build_image_set",
    "make_document_image",
    "parse_buckets",
]

SCENARIOS = ("fixed", "mixed", "large", "folder", "soak", "retry")
DEFAULT_BUCKETS = "640x480:4,1024x768:3,2048x1536:2,4000x3000:1"
FIXED_SIZE_PX = (1000, 700)
BAND_SPREAD = 0.3  # a folder's band of sizes: up to 30% more pixels than its smallest image (band_by_pixels)
DEFAULT_DOCUMENTS = DocumentOptions()
_BUCKET_RE = re.compile(r"^(\d+)\s*[xX×]\s*(\d+)(?:\s*:\s*(\d+(?:\.\d*)?|\.\d+))?$")


@dataclass(frozen=True)
class Bucket:
    width_px: int
    height_px: int
    weight: float

    @property
    def name(self) -> str:
        return bucket_of(self.width_px, self.height_px)


@dataclass(frozen=True)
class ImageSet:
    """The images of one scenario and their pick weights (same order as `items`)."""

    scenario: str
    items: tuple[ImageItem, ...]
    weights: tuple[float, ...]
    _cum_weights: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.items:
            raise ScenarioError(f"scenario {self.scenario!r} has no images; give at least one")
        if len(self.weights) != len(self.items):
            raise ScenarioError(
                f"scenario {self.scenario!r}: {len(self.items)} images but {len(self.weights)} weights"
            )
        if any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
            raise ScenarioError(f"scenario {self.scenario!r}: weights must be >= 0 with a positive sum")
        object.__setattr__(self, "_cum_weights", tuple(itertools.accumulate(self.weights)))

    def pick(self, rng: random.Random) -> ImageItem:
        """One image, drawn with probability proportional to its weight."""
        if len(self.items) == 1:
            return self.items[0]
        x = rng.random() * self._cum_weights[-1]
        i = bisect.bisect_right(self._cum_weights, x)
        return self.items[min(i, len(self.items) - 1)]

    @property
    def buckets(self) -> tuple[str, ...]:
        """Distinct size buckets, in item order."""
        return tuple(dict.fromkeys(item.bucket for item in self.items))

    def by_size(self) -> tuple[ImageItem, ...]:
        """One image per size bucket (its largest, the first of those: a band's memory is its largest page's),
        fewest pixels first: the order the baseline sends each size alone in, so a caching allocator's
        high-water mark rises at each new size (issue 49)."""
        largest: dict[str, ImageItem] = {}
        for item in self.items:
            seen = largest.get(item.bucket)
            if seen is None or _pixels(item) > _pixels(seen):
                largest[item.bucket] = item
        return tuple(sorted(largest.values(), key=lambda item: (_pixels(item), item.bucket)))

    def size_weights(self) -> dict[str, float]:
        """Each size bucket's share of the picks (the weights of its images, normalised), in item order."""
        total = sum(self.weights)
        out: dict[str, float] = {}
        for item, weight in zip(self.items, self.weights, strict=True):
            out[item.bucket] = out.get(item.bucket, 0.0) + weight / total
        return out


def _pixels(item: ImageItem) -> int:
    return item.width_px * item.height_px


def band_by_pixels(items: list[ImageItem]) -> list[ImageItem]:
    """A folder's images in bands of pixels (issue 49): from the fewest pixels up, a band holds the images with
    at most BAND_SPREAD more pixels than its smallest (its centre +-15%), so scans of slightly differing sizes
    make a few rows, not one each. A band is named by its size range, "WxH..WxH" (its smallest and largest
    image), or "WxH" where all its images are one size (a folder of one size keeps its bucket). Folder order."""
    bands: list[list[ImageItem]] = []
    for item in sorted(items, key=_pixels):
        if bands and _pixels(item) <= _pixels(bands[-1][0]) * (1 + BAND_SPREAD):
            bands[-1].append(item)
        else:
            bands.append([item])
    name: dict[int, str] = {}
    for band in bands:
        low, high = band[0], band[-1]
        label = low.bucket if all(item.bucket == low.bucket for item in band) else f"{low.bucket}..{high.bucket}"
        name.update((id(item), label) for item in band)
    return [replace(item, bucket=name[id(item)]) for item in items]


def parse_buckets(text: str) -> tuple[Bucket, ...]:
    """Parse "WxH:weight,..." (weight optional, default 1; 0 drops the bucket)."""
    hint = f"write buckets as WxH:weight,..., e.g. {DEFAULT_BUCKETS}"
    buckets: list[Bucket] = []
    seen: set[str] = set()
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        m = _BUCKET_RE.match(entry)
        if not m:
            raise ScenarioError(f"bad bucket {entry!r} in {text!r}; {hint}")
        bucket = Bucket(int(m.group(1)), int(m.group(2)), float(m.group(3)) if m.group(3) else 1.0)
        if bucket.width_px < 1 or bucket.height_px < 1:
            raise ScenarioError(f"bad bucket {entry!r} in {text!r}: width and height must be >= 1; {hint}")
        if bucket.name in seen:
            raise ScenarioError(f"bucket {bucket.name} appears twice in {text!r}; give each size once")
        seen.add(bucket.name)
        if bucket.weight > 0:
            buckets.append(bucket)
    if not buckets:
        raise ScenarioError(f"buckets {text!r} name no size with a positive weight; {hint}")
    return tuple(buckets)


def build_image_set(
    scenario: str,
    images: str | None = None,
    seed: int = 0,
    buckets: str | None = None,
    max_pixels: int = 50_000_000,
    *,
    variants: int = 1,
    documents: DocumentOptions = DEFAULT_DOCUMENTS,
) -> ImageSet:
    """The ImageSet for a scenario (see module doc); every user error is one ScenarioError line."""
    name = scenario.strip().lower()
    if name not in SCENARIOS:
        raise ScenarioError(f"unknown scenario {scenario!r}; use one of {', '.join(SCENARIOS)}")
    if max_pixels < 1:
        raise ScenarioError(f"max_pixels must be >= 1, got {max_pixels}")
    if variants < 1:
        raise ScenarioError(f"variants must be >= 1, got {variants}")
    check_document_options(documents)
    if buckets is not None and name != "mixed":
        raise ScenarioError(f"buckets apply only to SCENARIO=mixed, not {name}; drop BUCKETS or use mixed")
    path = Path(images).expanduser() if images else None

    if name in ("mixed", "large") and path is not None:
        raise ScenarioError(f"SCENARIO={name} generates its own images; drop IMAGES or use SCENARIO=folder")
    if name == "folder":
        if path is None:
            raise ScenarioError("SCENARIO=folder needs IMAGES=<folder of images>")
        return _from_items(name, band_by_pixels(load_folder(path, max_pixels, documents)))
    if name == "fixed" and path is not None and path.is_dir():
        raise ScenarioError(
            f"SCENARIO=fixed takes one image file, but {path} is a folder; use SCENARIO=folder"
        )
    if path is not None:  # fixed, soak, retry with the user's images
        items = band_by_pixels(load_folder(path, max_pixels, documents)) if path.is_dir() else load_path(path, max_pixels, documents)
        return _from_items(name, items)

    if name == "mixed":
        sizes = parse_buckets(DEFAULT_BUCKETS if buckets is None else buckets)
        return _generated(name, [(b, "page", "PNG") for b in sizes], seed, variants, max_pixels)
    if name == "large":
        plan = [(Bucket(1080, 8000, 1.0), "receipt", "PNG"), (Bucket(4000, 3000, 1.0), "photo", "JPEG")]
        return _generated(name, plan, seed, variants, max_pixels)
    return _generated(name, [(Bucket(*FIXED_SIZE_PX, 1.0), "page", "PNG")], seed, variants, max_pixels)


def _from_items(scenario: str, items: list[ImageItem]) -> ImageSet:
    return ImageSet(scenario, tuple(items), tuple(item.weight for item in items))


def _generated(
    scenario: str, plan: list[tuple[Bucket, str, str]], seed: int, variants: int, max_pixels: int
) -> ImageSet:
    for bucket, _, _ in plan:  # refuse before drawing anything
        if bucket.width_px * bucket.height_px > max_pixels:
            raise ScenarioError(
                f"bucket {bucket.name} is {bucket.width_px * bucket.height_px / 1e6:.1f} Mpx, over the limit of "
                f"{max_pixels / 1e6:g} Mpx; use a smaller bucket or raise max_pixels"
            )
    items: list[ImageItem] = []
    for bucket, layout, fmt in plan:
        for k in range(variants):
            page = make_document_image(bucket.width_px, bucket.height_px, seed + k, fmt=fmt, layout=layout)
            items.append(replace(page, weight=bucket.weight / variants))
    return _from_items(scenario, items)
