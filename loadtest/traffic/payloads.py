"""Payloads: the image set and each image's request, built once per process and reused as bytes.

A worker builds them from the image set its master sent (loadtest/wiring/link.py), never from its own disk.

No Locust here, so the CLI's pre-flight checks build exactly what the workers will send.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Any

from loadtest.settings.run_config import RunConfig
from scenarios import EncodedRequest, ImageItem, ImageSet, build_image_set, encode_request
from scenarios.documents import DocumentOptions, documents_sent
from scenarios.errors import ScenarioError
from scenarios.kserve import KserveTensors
from scenarios.resize import SizeChange, resize_image_set

SMALLEST = "smallest"  # a phase's pages: the set's smallest page only (a mix's baseline warm-up)
EACH_SIZE = "each size"  # each size alone in turn, fewest pixels first, SIZE_ALONE_REQUESTS each (the sizes phase)
SIZE_ALONE_REQUESTS = 3  # a size's requests alone: the median of 3 rises stands against one odd reading


@dataclass(frozen=True)
class Payloads:
    """The image set and each image's request, encoded once."""

    config: RunConfig
    image_set: ImageSet
    encoded: dict[str, EncodedRequest]  # by image name
    headers: dict[str, str]

    def pick(self, rng: random.Random, pages: str = "", sent: int = 0) -> tuple[ImageItem, EncodedRequest]:
        """The next page: drawn from the mix by weight, or as the phase's `pages` says (`sent`: the user's
        requests so far in the phase; past the last size the sizes start over)."""
        if pages == SMALLEST:
            item = self.image_set.by_size()[0]
        elif pages == EACH_SIZE:
            order = self.image_set.by_size()
            item = order[(sent // SIZE_ALONE_REQUESTS) % len(order)]
        else:
            item = self.image_set.pick(rng)
        return item, self.encoded[item.name]


def image_set_for(cfg: RunConfig) -> ImageSet:
    """The images a run sends, read or generated from the config (on the master, or a local run), resized
    to MAX_SIDE when it is set."""
    return _sized_set(cfg.scenario, cfg.images, cfg.seed, cfg.buckets, cfg.max_side, _documents(cfg))[0]


def page_sizes_of(cfg: RunConfig) -> int:
    """The size buckets of the images the run sends (two or more: a mix, whose baseline measures each
    alone: loadtest/method/plan.py); 1 where the set cannot be built (the pre-flight says why, once)."""
    try:
        return len(image_set_for(cfg).buckets)
    except ScenarioError:
        return 1


def page_mix_of(cfg: RunConfig) -> dict[str, Any]:
    """The manifest's `page_mix` for a mix of sizes: each size bucket's weight in the mix as configured
    (analysis reads the table's weights from it, not from the draws, which may miss a rare size); {} for one."""
    try:
        weights = image_set_for(cfg).size_weights()
    except ScenarioError:
        return {}
    if len(weights) < 2:
        return {}
    return {"page_mix": {"weights": weights, "alone_requests": SIZE_ALONE_REQUESTS}}


def images_sent(cfg: RunConfig) -> dict[str, Any]:
    """The manifest's `images_sent` when MAX_SIDE is set: {"max_side_px", "sizes": [{"bucket", "before_px",
    "after_px", "bytes", ...}]} of the payloads actually sent; {} when it is off. With `documents` where
    IMAGES holds PDFs or TIFFs: {"dpi", "files": [{"file", "pages", "pages_sent", "text_layer_pages"}]}."""
    image_set, changes = _sized_set(cfg.scenario, cfg.images, cfg.seed, cfg.buckets, cfg.max_side, _documents(cfg))
    files = documents_sent(image_set.items)
    out: dict[str, Any] = {"documents": {"dpi": cfg.dpi, "files": files}} if files else {}
    if not cfg.max_side:
        return out
    sizes = [
        {"bucket": c.bucket, "before_px": list(c.before_px), "after_px": list(c.after_px), "bytes": c.bytes_after,
         "bytes_before": c.bytes_before, "name": c.name}  # fmt: skip
        for c in changes
    ]
    return {**out, "images_sent": {"max_side_px": cfg.max_side, "sizes": sizes}}


def unchanged_resize(cfg: RunConfig, name: str = "MAX_SIDE") -> str:
    """The warning for a MAX_SIDE no page is larger than ("" when it resizes one, or is off): a run or a sweep's
    setting with it measures what MAX_SIDE=0 measures. `name`: the setting as the user wrote it."""
    sizes = images_sent(cfg).get("images_sent", {}).get("sizes", [])
    if not sizes or any(s["before_px"] != s["after_px"] for s in sizes):
        return ""
    largest = max(max(s["before_px"]) for s in sizes)
    return (
        f"warning: {name}={cfg.max_side} changes no page (the largest is {largest} px on its longest side):"
        f" it sends what {name}=0 sends; give a {name} below {largest} px to measure smaller pages"
    )


def _documents(cfg: RunConfig) -> DocumentOptions:
    return DocumentOptions(dpi=cfg.dpi, max_pages=cfg.max_pages)


@functools.lru_cache(maxsize=2)  # the pre-flight, the manifest and a local run read the same set once
def _sized_set(
    scenario: str, images: str, seed: int, buckets: str, max_side_px: int, documents: DocumentOptions
) -> tuple[ImageSet, tuple[SizeChange, ...]]:
    image_set = build_image_set(
        scenario, images or None, seed=seed, buckets=buckets or None, documents=documents
    )
    if not max_side_px:
        return image_set, ()
    return resize_image_set(image_set, max_side_px)


def build_payloads(cfg: RunConfig, image_set: ImageSet | None = None) -> Payloads:
    """Each image's request; a worker passes the image set its master sent (its IMAGES are not read)."""
    if image_set is None:
        image_set = image_set_for(cfg)
    encoded = {
        item.name: encode_request(
            item,
            cfg.style,
            endpoint=cfg.endpoint_path,
            field=cfg.field or None,
            model=cfg.model,
            prompt=cfg.prompt,
            max_tokens=cfg.max_tokens,
            stream=cfg.stream,
            tensors=KserveTensors(cfg.kserve_input, cfg.kserve_output, cfg.kserve_binary)
            if cfg.style == "kserve"
            else None,
        )
        for item in image_set.items
    }
    return Payloads(cfg, image_set, encoded, cfg.header_dict())
