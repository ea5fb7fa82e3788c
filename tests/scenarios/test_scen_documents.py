"""PDFs and TIFFs as pages: rendered once at DPI, a PDF's text layer as expected text, MAX_PAGES, and every
bad document as one clear line naming the file. The PDFs are made here with reportlab (a real text layer)."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pypdfium2 as pdfium
import pytest
from PIL import Image
from reportlab.pdfgen import canvas

from loadtest.settings.run_config import RunConfig
from loadtest.traffic.payloads import images_sent
from scenarios import ScenarioError, build_image_set, decode_image_set, encode_image_set
from scenarios.documents import DocumentOptions, documents_sent

LETTER_PT = (612, 792)


def _pdf(path: Path, pages: list[list[str]], size_pt: tuple[int, int] = LETTER_PT, **kwargs: object) -> None:
    """A PDF with one page per entry, each line drawn as real text (a text layer); [] is a blank page."""
    out = io.BytesIO()
    c = canvas.Canvas(out, pagesize=size_pt, **kwargs)  # type: ignore[arg-type]
    for lines in pages:
        for i, line in enumerate(lines):
            c.setFont("Helvetica", 24)
            c.drawString(72, size_pt[1] - 100 - 40 * i, line)
        c.showPage()
    c.save()
    path.write_bytes(out.getvalue())


def _tiff(path: Path, frames: list[tuple[tuple[int, int], str]]) -> None:
    images = [Image.new("RGB", size, color) for size, color in frames]
    images[0].save(path, "TIFF", save_all=True, append_images=images[1:])


def _error(**kwargs: object) -> str:
    with pytest.raises(ScenarioError) as err:
        build_image_set(**kwargs)  # type: ignore[arg-type]
    message = str(err.value)
    assert "\n" not in message
    return message


def test_pdf_pages_are_images_with_their_text_layer_as_expected_text(tmp_path: Path) -> None:
    _pdf(tmp_path / "invoice.pdf", [["Invoice 1234", "Total due 56.78"], [], ["Thank you"]])
    Image.new("RGB", (40, 30), "white").save(tmp_path / "a.png")
    items = build_image_set("folder", images=str(tmp_path)).items
    assert [i.name for i in items] == ["a.png", "invoice.pdf#p1", "invoice.pdf#p2", "invoice.pdf#p3"]
    first, blank, third = items[1:]
    assert (first.width_px, first.height_px) == (1700, 2200)  # 8.5 x 11 in at the default 200 DPI
    assert first.bucket == "1700x2200" and first.mime == "image/png"
    assert first.expected_text == "Invoice 1234\nTotal due 56.78" and first.text_layer
    assert blank.expected_text is None and not blank.text_layer
    assert third.expected_text == "Thank you"
    assert {i.document_pages for i in items} == {0, 3}
    page = Image.open(io.BytesIO(first.data))
    assert page.size == (1700, 2200)
    assert page.convert("L").getextrema()[0] < 64  # the text was drawn: dark ink on the page
    assert Image.open(io.BytesIO(blank.data)).convert("L").getextrema() == (255, 255)
    assert documents_sent(items) == [
        {"file": "invoice.pdf", "pages": 3, "pages_sent": 3, "text_layer_pages": [1, 3]}
    ]


def test_dpi_sets_the_rendered_size(tmp_path: Path) -> None:
    _pdf(tmp_path / "a.pdf", [["x"]], size_pt=(144, 72))
    item = build_image_set("fixed", images=str(tmp_path / "a.pdf"), documents=DocumentOptions(dpi=300)).items[0]
    assert (item.width_px, item.height_px) == (600, 300)
    assert Image.open(io.BytesIO(item.data)).size == (600, 300)


def test_multipage_tiff_sends_every_frame(tmp_path: Path) -> None:
    _tiff(tmp_path / "scan.tif", [((300, 200), "red"), ((200, 400), "blue"), ((300, 200), "green")])
    items = build_image_set("fixed", images=str(tmp_path / "scan.tif")).items
    assert [i.name for i in items] == ["scan.tif#p1", "scan.tif#p2", "scan.tif#p3"]
    assert [i.bucket for i in items] == ["300x200", "200x400", "300x200"]
    colors = [Image.open(io.BytesIO(i.data)).convert("RGB").getpixel((5, 5)) for i in items]
    assert colors == [(255, 0, 0), (0, 0, 255), (0, 128, 0)]
    assert all(i.expected_text is None and i.document_pages == 3 for i in items)


def test_max_pages_renders_only_the_first_pages_and_counts_the_rest(tmp_path: Path) -> None:
    _pdf(tmp_path / "long.pdf", [[f"page {n}"] for n in range(1, 8)])
    items = build_image_set(
        "folder", images=str(tmp_path), documents=DocumentOptions(max_pages=2)
    ).items
    assert [(i.name, i.expected_text) for i in items] == [("long.pdf#p1", "page 1"), ("long.pdf#p2", "page 2")]
    assert documents_sent(items)[0] == {"file": "long.pdf", "pages": 7, "pages_sent": 2, "text_layer_pages": [1, 2]}


def test_expected_json_names_a_page_and_wins_over_the_text_layer(tmp_path: Path) -> None:
    _pdf(tmp_path / "a.pdf", [["printed"], ["second"]])
    (tmp_path / "expected.json").write_text(json.dumps({"a.pdf#p2": "typed by hand"}), encoding="utf-8")
    items = build_image_set("folder", images=str(tmp_path)).items
    assert [(i.expected_text, i.text_layer) for i in items] == [("printed", True), ("typed by hand", False)]
    (tmp_path / "expected.json").write_text(json.dumps({"b.pdf#p1": "x"}), encoding="utf-8")
    assert "b.pdf#p1" in _error(scenario="folder", images=str(tmp_path))


def test_pages_travel_to_workers_with_their_facts(tmp_path: Path) -> None:
    _pdf(tmp_path / "a.pdf", [["one"], []])
    image_set = build_image_set("folder", images=str(tmp_path), documents=DocumentOptions(dpi=72))
    back = decode_image_set(encode_image_set(image_set))
    assert back == image_set
    assert [(i.text_layer, i.document_pages) for i in back.items] == [(True, 2), (False, 2)]


def test_the_manifest_says_which_pages_had_a_text_layer(tmp_path: Path) -> None:
    _pdf(tmp_path / "a.pdf", [[], ["words"]])
    cfg = RunConfig(scenario="folder", images=str(tmp_path), dpi=100, max_pages=5)
    assert images_sent(cfg) == {
        "documents": {
            "dpi": 100,
            "files": [{"file": "a.pdf", "pages": 2, "pages_sent": 2, "text_layer_pages": [2]}],
        }
    }
    assert images_sent(dataclasses.replace(cfg, scenario="fixed", images="")) == {}


def test_encrypted_pdf_is_one_line_naming_the_file(tmp_path: Path) -> None:
    _pdf(tmp_path / "secret.pdf", [["hidden"]], encrypt="pw")
    message = _error(scenario="folder", images=str(tmp_path))
    assert str(tmp_path / "secret.pdf") in message and "encrypted" in message and "decrypt" in message


def test_broken_pdf_is_one_line_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4\n1 0 obj garbage")
    message = _error(scenario="folder", images=str(tmp_path))
    assert str(tmp_path / "broken.pdf") in message and "PDFium can read" in message


def test_pdf_without_pages_is_one_line_naming_the_file(tmp_path: Path) -> None:
    out = io.BytesIO()
    pdfium.PdfDocument.new().save(out)
    (tmp_path / "empty.pdf").write_bytes(out.getvalue())
    message = _error(scenario="fixed", images=str(tmp_path / "empty.pdf"))
    assert str(tmp_path / "empty.pdf") in message and "no pages" in message


def test_a_page_over_max_pixels_is_refused_before_it_is_drawn(tmp_path: Path) -> None:
    _pdf(tmp_path / "poster.pdf", [["big"]], size_pt=(72 * 40, 72 * 40))  # 40 x 40 in: 64 Mpx at 200 DPI
    message = _error(scenario="folder", images=str(tmp_path))
    assert "poster.pdf#p1" in message and "lower DPI" in message


def test_broken_tiff_is_one_line_naming_the_file(tmp_path: Path) -> None:
    _tiff(tmp_path / "scan.tiff", [((300, 200), "red"), ((300, 200), "blue")])
    data = (tmp_path / "scan.tiff").read_bytes()
    (tmp_path / "scan.tiff").write_bytes(data[: len(data) // 3])
    message = _error(scenario="folder", images=str(tmp_path))
    assert str(tmp_path / "scan.tiff") in message


@pytest.mark.parametrize(("options", "word"), [(DocumentOptions(dpi=10), "DPI=10"),
                                               (DocumentOptions(max_pages=0), "MAX_PAGES=0")])  # fmt: skip
def test_bad_document_options_are_named(options: DocumentOptions, word: str) -> None:
    assert word in _error(scenario="fixed", documents=options)
