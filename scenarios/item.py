"""One image ready to send: its bytes, its size bucket, its ground truth and its weight in a set."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ImageItem:
    """An image as sent on the wire; `data` is the exact file bytes, encoded once."""

    name: str
    bucket: str  # "WxH" in pixels, e.g. "1000x700"; the per-bucket breakdown groups by it
    width_px: int
    height_px: int
    data: bytes
    mime: str  # e.g. "image/png"
    expected_text: str | None  # ground truth when known, else None (no character error rate)
    weight: float  # relative pick weight inside its ImageSet
    text_layer: bool = False  # expected_text is the text layer of the PDF page this image is
    document_pages: int = 0  # a page of a PDF or TIFF (named `file.pdf#p3`): the document's pages in all; 0: an image

    def __repr__(self) -> str:  # keep megabytes of image bytes out of logs and test failures
        return (
            f"ImageItem(name={self.name!r}, bucket={self.bucket!r}, bytes={len(self.data)}, "
            f"mime={self.mime!r}, expected_chars={None if self.expected_text is None else len(self.expected_text)}, "
            f"weight={self.weight})"
        )


def bucket_of(width_px: int, height_px: int) -> str:
    return f"{width_px}x{height_px}"
