"""Payloads: the image set and each image's request, built once per process and reused as bytes.

A worker builds them from the image set its master sent (loadtest/link.py), never from its own disk.

No Locust here, so the CLI's pre-flight checks build exactly what the workers will send.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from loadtest.config import RunConfig
from scenarios import EncodedRequest, ImageItem, ImageSet, build_image_set, encode_request


@dataclass(frozen=True)
class Payloads:
    """The image set and each image's request, encoded once."""

    config: RunConfig
    image_set: ImageSet
    encoded: dict[str, EncodedRequest]  # by image name
    headers: dict[str, str]

    def pick(self, rng: random.Random) -> tuple[ImageItem, EncodedRequest]:
        item = self.image_set.pick(rng)
        return item, self.encoded[item.name]


def image_set_for(cfg: RunConfig) -> ImageSet:
    """The images a run sends, read or generated from the config (on the master, or a local run)."""
    return build_image_set(cfg.scenario, cfg.images or None, seed=cfg.seed, buckets=cfg.buckets or None)


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
        )
        for item in image_set.items
    }
    return Payloads(cfg, image_set, encoded, cfg.header_dict())
