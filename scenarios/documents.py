"""Documents as pages: a PDF or a (multi-page) TIFF becomes one image per page, rendered once before load.

- PDF: pypdfium2 (PDFium, the renderer Chrome uses) renders each page at `dpi` to an RGB bitmap, encoded
  once as PNG (lossless: OCR sees what PDFium drew). The page's text layer, where it has one (a
  born-digital PDF; a scan has none), is that page's expected text, so CER under load comes free; it is
  also written in the PNG's `ocr_text` chunk, as a generated page's truth is (scenarios/pages.py).
- TIFF: Pillow's frames, each encoded once as PNG (most OCR servers do not take TIFF, and none take a
  multi-page one as several pages). A scan has no text layer.
Pages are named `<file>#p<n>` (1-based) and grouped by their size bucket as any image. At most
`max_pages` pages of one document are rendered (the first ones); the rest are counted, not drawn, so a
100-page PDF costs `max_pages` renderings and their encoded bytes only. Each page's size is checked
against `max_pixels` BEFORE it is drawn. An encrypted, broken or empty document is one ScenarioError line
naming the file.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_raw
from PIL import Image, ImageSequence, PngImagePlugin

from scenarios.errors import ScenarioError
from scenarios.item import ImageItem, bucket_of
from scenarios.pages import TEXT_KEY

PDF_MAGIC = b"%PDF-"
DOCUMENT_SUFFIXES = (".pdf", ".tif", ".tiff")
DEFAULT_DPI = 200
DEFAULT_MAX_PAGES = 50
MIN_DPI, MAX_DPI = 36, 1200
POINTS_PER_INCH = 72.0
_PNG_MODES = ("1", "L", "RGB", "RGBA", "P", "I;16")


@dataclass(frozen=True)
class DocumentOptions:
    """How documents become pages: the rendering resolution and the most pages of one document."""

    dpi: int = DEFAULT_DPI
    max_pages: int = DEFAULT_MAX_PAGES


def check_document_options(options: DocumentOptions) -> None:
    if not MIN_DPI <= options.dpi <= MAX_DPI:
        raise ScenarioError(f"bad DPI={options.dpi}: give {MIN_DPI}..{MAX_DPI} (200 reads small print; 300 is a fine scan)")
    if options.max_pages < 1:
        raise ScenarioError(f"bad MAX_PAGES={options.max_pages}: give the most pages of one document to send, >= 1")


def is_document(path: Path, head: bytes) -> bool:
    """A PDF (by its magic or its suffix) or a TIFF (by its suffix): read as pages, not as one image."""
    return head.lstrip()[:5] == PDF_MAGIC or path.suffix.lower() in DOCUMENT_SUFFIXES


def page_name(file_name: str, page_no: int) -> str:
    return f"{file_name}#p{page_no}"


def load_document(path: Path, data: bytes, options: DocumentOptions, max_pixels: int) -> list[ImageItem]:
    """The pages of the PDF or TIFF in `data` (read from `path`), each carrying the document's page count."""
    if data.lstrip()[:5] == PDF_MAGIC or path.suffix.lower() == ".pdf":
        pages, pages_total = _pdf_pages(path, data, options.dpi, options.max_pages, max_pixels)
    else:
        pages, pages_total = _tiff_pages(path, data, options.max_pages, max_pixels)
    return [replace(page, document_pages=pages_total) for page in pages]


def _pdf_pages(
    path: Path, data: bytes, dpi: int, max_pages: int, max_pixels: int
) -> tuple[list[ImageItem], int]:
    try:
        pdf = pdfium.PdfDocument(data)
    except pdfium.PdfiumError as e:
        code = getattr(e, "err_code", None)
        if code == pdfium_raw.FPDF_ERR_PASSWORD:
            raise ScenarioError(
                f"{path} is an encrypted PDF; give a decrypted copy (e.g. qpdf --decrypt in.pdf out.pdf)"
            ) from None
        # PDFium refuses a document without pages as it refuses a broken one
        raise ScenarioError(
            f"{path} is not a PDF PDFium can read, or has no pages ({e}); repair, replace or remove it"
        ) from None
    try:
        pages_total = len(pdf)
        if pages_total == 0:
            raise ScenarioError(f"{path} is a PDF with no pages; remove it from IMAGES")
        items = [_pdf_page(path, pdf, i, dpi, max_pixels) for i in range(min(pages_total, max_pages))]
    finally:
        pdf.close()
    return items, pages_total


def _pdf_page(path: Path, pdf: pdfium.PdfDocument, index: int, dpi: int, max_pixels: int) -> ImageItem:
    name = page_name(path.name, index + 1)
    page = pdf[index]
    try:
        width_pt, height_pt = page.get_size()
        scale = dpi / POINTS_PER_INCH
        width_px, height_px = round(width_pt * scale), round(height_pt * scale)
        if width_px < 1 or height_px < 1:
            raise ScenarioError(f"{name} is an empty page ({width_pt:g}x{height_pt:g} pt); remove it")
        if width_px * height_px > max_pixels:
            raise ScenarioError(
                f"{name} is {width_px}x{height_px} px at {dpi} DPI, over the limit of {max_pixels / 1e6:g} Mpx;"
                " lower DPI"
            )
        textpage = page.get_textpage()
        try:
            text = _layer_text(textpage.get_text_range())
        finally:
            textpage.close()
        bitmap = page.render(scale=scale)
        image = bitmap.to_pil()
    except pdfium.PdfiumError as e:
        raise ScenarioError(f"cannot render {name} ({e}); repair or replace the PDF") from None
    finally:
        page.close()
    return _page_item(name, image, text)


def _layer_text(raw: str) -> str | None:
    """A page's text layer as expected text: PDFium's CRLF line ends as newlines; blank means none."""
    text = raw.replace("\r\n", "\n").replace("\r", "\n").strip()
    return text or None


def _tiff_pages(path: Path, data: bytes, max_pages: int, max_pixels: int) -> tuple[list[ImageItem], int]:
    items: list[ImageItem] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # max_pixels is ours, per frame
            warnings.simplefilter("error", UserWarning)  # Pillow's "Corrupt EXIF data": a damaged file
            with Image.open(io.BytesIO(data)) as im:
                pages_total = getattr(im, "n_frames", 1)
                for i, frame in enumerate(ImageSequence.Iterator(im)):
                    if i >= max_pages:
                        break
                    name = page_name(path.name, i + 1)
                    width_px, height_px = frame.size
                    if width_px * height_px > max_pixels:
                        raise ScenarioError(
                            f"{name} is {width_px}x{height_px} px, over the limit of {max_pixels / 1e6:g} Mpx;"
                            " shrink the scan"
                        )
                    page = frame.copy()
                    items.append(_page_item(name, page if page.mode in _PNG_MODES else page.convert("RGB"), None))
    except ScenarioError:
        raise
    except (OSError, SyntaxError, ValueError, EOFError, UserWarning, Image.DecompressionBombError) as e:
        raise ScenarioError(f"cannot read the TIFF {path} ({e}); it is truncated or corrupt, replace it") from None
    return items, pages_total


def _page_item(name: str, image: Image.Image, text: str | None) -> ImageItem:
    out = io.BytesIO()
    info = PngImagePlugin.PngInfo()
    if text is not None:  # the text layer rides in the page as the generated pages' truth does: the
        info.add_text(TEXT_KEY, text)  # simulator answers it; a real OCR server ignores a PNG text chunk
    image.save(out, "PNG", pnginfo=info, compress_level=3)  # as the generated pages: ~2x faster than 6
    width_px, height_px = image.size
    return ImageItem(
        name=name,
        bucket=bucket_of(width_px, height_px),
        width_px=width_px,
        height_px=height_px,
        data=out.getvalue(),
        mime="image/png",
        expected_text=text,
        weight=1.0,
        text_layer=text is not None,
    )


def documents_sent(items: tuple[ImageItem, ...]) -> list[dict[str, object]]:
    """The manifest's word on each document: its pages in all, those sent, and which had a text layer
    (their expected text came free); [] when no item is a page."""
    by_file: dict[str, list[ImageItem]] = {}
    for item in items:
        if item.document_pages:
            by_file.setdefault(item.name.rsplit("#p", 1)[0], []).append(item)
    return [
        {
            "file": file_name,
            "pages": pages[0].document_pages,
            "pages_sent": len(pages),
            "text_layer_pages": [int(p.name.rsplit("#p", 1)[1]) for p in pages if p.text_layer],
        }
        for file_name, pages in by_file.items()
    ]
