"""An image set as one byte string, for the master to send to its workers (and back into an ImageSet).

Layout: MAGIC, a 4-byte big-endian header length, a JSON header (scenario, and per item its name,
bucket, size, mime, expected text, weight, page facts and byte count), then every item's bytes in order. The
encoding is deterministic, so its SHA-256 (`digest`) names the set: a worker that holds a set with
that digest needs nothing more. Stdlib only (scenarios may not import msgpack or locust).
"""

from __future__ import annotations

import hashlib
import json
import struct

from scenarios.errors import ScenarioError
from scenarios.images import ImageSet
from scenarios.item import ImageItem

MAGIC = b"OCRIMG1\n"
_LEN = struct.Struct(">I")


def encode_image_set(image_set: ImageSet) -> bytes:
    items = [
        {
            "name": i.name,
            "bucket": i.bucket,
            "width_px": i.width_px,
            "height_px": i.height_px,
            "mime": i.mime,
            "expected_text": i.expected_text,
            "weight": i.weight,
            "text_layer": i.text_layer,
            "document_pages": i.document_pages,
            "bytes": len(i.data),
        }
        for i in image_set.items
    ]
    header = {"scenario": image_set.scenario, "weights": list(image_set.weights), "items": items}
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return b"".join([MAGIC, _LEN.pack(len(head)), head, *(i.data for i in image_set.items)])


def digest(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def decode_image_set(blob: bytes, expected_digest: str | None = None) -> ImageSet:
    """The ImageSet `encode_image_set` wrote; ScenarioError when the bytes are not whole or not ours."""
    if expected_digest is not None and digest(blob) != expected_digest:
        raise ScenarioError(f"image set damaged in transit: its SHA-256 is not {expected_digest[:12]}")
    if not blob.startswith(MAGIC) or len(blob) < len(MAGIC) + _LEN.size:
        raise ScenarioError("not an image set sent by an ocr-capacity master (bad header)")
    start = len(MAGIC) + _LEN.size
    (head_len,) = _LEN.unpack_from(blob, len(MAGIC))
    try:
        header = json.loads(blob[start : start + head_len].decode("utf-8"))
        offset = start + head_len
        items = []
        for meta in header["items"]:
            size = int(meta.pop("bytes"))
            items.append(ImageItem(data=blob[offset : offset + size], **meta))
            offset += size
        weights = tuple(float(w) for w in header["weights"])
        scenario = str(header["scenario"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ScenarioError(f"not an image set sent by an ocr-capacity master: {exc}") from None
    if offset != len(blob):
        raise ScenarioError(f"image set cut short or padded: {len(blob)} bytes, header says {offset}")
    return ImageSet(scenario, tuple(items), weights)
