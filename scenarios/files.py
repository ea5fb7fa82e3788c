"""The user's own images: one file or a folder, checked before any load starts.

Each file is read once; its size is taken from the header (Pillow opens lazily) and refused over
`max_pixels` BEFORE any pixel is decoded (decompression bombs), then decoded once to prove it is whole.
The bytes sent are the file's own bytes, never re-encoded; a PDF or TIFF is read as its pages instead
(scenarios.documents). Expected text, first found wins: `expected.json` ({filename or `file.pdf#p2`:
text}) in the folder, a PDF page's text layer, a sidecar `<stem>.txt` or `<name>.txt` beside the image,
an `ocr_text` PNG chunk / JPEG comment inside it. Folders are read flat (no recursion); hidden files,
`*.txt` sidecars and `expected.json` are not images; any other file must be an image or a document.
"""

from __future__ import annotations

import io
import json
import warnings
from dataclasses import replace
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from scenarios.documents import DocumentOptions, is_document, load_document
from scenarios.errors import ScenarioError
from scenarios.item import ImageItem, bucket_of
from scenarios.pages import read_ground_truth

EXPECTED_FILE = "expected.json"
SIDECAR_SUFFIX = ".txt"


def load_path(
    path: Path, max_pixels: int, documents: DocumentOptions, expected: dict[str, str] | None = None
) -> list[ImageItem]:
    """One file's images: a PDF's or TIFF's pages (scenarios.documents), else the image itself. `expected`
    maps a file or page name (`scan.pdf#p2`) to its expected text, first of all sources."""
    expected = expected or {}
    data = _read_file(path)
    if not is_document(path, data[:1024]):
        return [load_image_file(path, max_pixels, expected.get(path.name), data=data)]
    pages = load_document(path, data, documents, max_pixels)
    return [replace(p, expected_text=expected[p.name], text_layer=False) if p.name in expected else p for p in pages]


def load_image_file(
    path: Path, max_pixels: int, expected_text: str | None = None, *, data: bytes | None = None
) -> ImageItem:
    """Read and check one image file; raises ScenarioError naming the file and the fix."""
    if data is None:
        data = _read_file(path)
    width_px, height_px, fmt = _check_pixels(path, data, max_pixels)
    if expected_text is None:
        expected_text = _read_sidecar(path)
    if expected_text is None:
        expected_text = read_ground_truth(data)
    return ImageItem(
        name=path.name,
        bucket=bucket_of(width_px, height_px),
        width_px=width_px,
        height_px=height_px,
        data=data,
        mime=Image.MIME.get(fmt, "application/octet-stream"),
        expected_text=expected_text,
        weight=1.0,
    )


def _read_file(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ScenarioError(
            f"image file {path} does not exist (or is a broken link); check the IMAGES path"
        ) from None
    except IsADirectoryError:
        raise ScenarioError(
            f"{path} is a folder, not an image file; use SCENARIO=folder for a folder"
        ) from None
    except OSError as e:
        raise ScenarioError(
            f"cannot read image file {path}: {e.strerror or e}; check its permissions"
        ) from None
    if not data:
        raise ScenarioError(f"image file {path} is empty (0 bytes); replace it or remove it from IMAGES")
    return data


def load_folder(folder: Path, max_pixels: int, documents: DocumentOptions) -> list[ImageItem]:
    """Every image and every document's pages in `folder` (flat, sorted by name), each as in load_path."""
    if not folder.exists():
        raise ScenarioError(f"image folder {folder} does not exist; check the IMAGES path")
    if not folder.is_dir():
        raise ScenarioError(f"{folder} is a file, not a folder; use SCENARIO=fixed for one image")
    expected = _read_expected_json(folder / EXPECTED_FILE)
    candidates = [
        p
        for p in sorted(folder.iterdir())
        if not p.name.startswith(".")
        and p.name != EXPECTED_FILE
        and p.suffix.lower() != SIDECAR_SUFFIX
        and not p.is_dir()
    ]
    if not candidates:
        raise ScenarioError(
            f"image folder {folder} has no images; put PNG/JPEG/PDF/TIFF files in it or point IMAGES elsewhere"
        )
    unknown = sorted({k for k in expected if k.split("#p")[0] not in {p.name for p in candidates}})
    if unknown:
        raise ScenarioError(
            f"{folder / EXPECTED_FILE} names {', '.join(unknown[:3])} which is not in the folder; fix the file names"
        )
    return [item for p in candidates for item in load_path(p, max_pixels, documents, expected)]


def _check_pixels(path: Path, data: bytes, max_pixels: int) -> tuple[int, int, str]:
    try:
        with warnings.catch_warnings():
            # we apply our own limit below; Pillow's own warning would be an error under strict settings
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as im:
                width_px, height_px = im.size
                fmt = im.format or ""
                if width_px * height_px > max_pixels:
                    raise ScenarioError(_too_big(path, width_px, height_px, max_pixels))
                im.load()
    except ScenarioError:
        raise
    except UnidentifiedImageError:
        raise ScenarioError(
            f"{path} is not an image Pillow can read; remove it from the folder or convert it to PNG/JPEG"
        ) from None
    except Image.DecompressionBombError as e:
        raise ScenarioError(f"{path} is refused as a decompression bomb ({e}); shrink the image") from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        raise ScenarioError(
            f"cannot decode image {path} ({e}); the file is truncated or corrupt, replace it"
        ) from None
    return width_px, height_px, fmt


def _too_big(path: Path, width_px: int, height_px: int, max_pixels: int) -> str:
    return (
        f"{path} is {width_px}x{height_px} = {width_px * height_px / 1e6:.1f} Mpx, over the limit of "
        f"{max_pixels / 1e6:g} Mpx (decompression bomb guard); shrink the image or raise max_pixels"
    )


def _read_sidecar(path: Path) -> str | None:
    for sidecar in (path.with_suffix(SIDECAR_SUFFIX), path.with_name(path.name + SIDECAR_SUFFIX)):
        if sidecar != path and sidecar.is_file():
            try:
                return sidecar.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise ScenarioError(
                    f"cannot read expected text {sidecar} ({e}); save it as UTF-8 text"
                ) from None
    return None


def _read_expected_json(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ScenarioError(f'cannot read {path} ({e}); write it as JSON {{"file.png": "text"}}') from None
    if not isinstance(loaded, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in loaded.items()
    ):
        raise ScenarioError(
            f'{path} must be one JSON object of file name to text, e.g. {{"page1.png": "text"}}'
        )
    return loaded
