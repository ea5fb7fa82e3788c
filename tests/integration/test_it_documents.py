"""A folder of documents as IMAGES, end to end: `python -m loadtest run` with a born-digital PDF (a text
layer, made here with reportlab) and a multi-page TIFF scan beside a PNG, against the simulator. Every page
is its own request, named and sized as rendered at DPI; the PDF's pages are answered with CER from their
text layer, with no expected text typed; the manifest lists the documents."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from it_procs import run_cli, start_simulator, stop
from PIL import Image
from reportlab.pdfgen import canvas

SHORT = ["--idle-s", "1", "--verify", "false", "--step-s", "3", "--warmup-s", "0.5", "--cooldown-s", "2",
         "--cooldown-min-s", "0.5", "--baseline-rounds", "1", "--baseline-round-requests", "10",
         "--refine", "false", "--workers", "0"]  # fmt: skip


def _documents(folder: Path) -> None:
    out = io.BytesIO()
    c = canvas.Canvas(out, pagesize=(612, 792))
    for lines in (["Invoice 2041", "Total due 118.20"], ["Thank you for your order"]):
        for i, line in enumerate(lines):
            c.setFont("Helvetica", 28)
            c.drawString(72, 700 - 44 * i, line)
        c.showPage()
    c.save()
    (folder / "invoice.pdf").write_bytes(out.getvalue())
    frames = [Image.new("RGB", (500, 700), "white"), Image.new("RGB", (700, 500), "white")]
    frames[0].save(folder / "scan.tif", "TIFF", save_all=True, append_images=frames[1:])


@pytest.mark.timeout(200)
def test_a_folder_of_pdf_and_tiff_runs_page_by_page_with_cer_from_the_text_layer(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    _documents(docs)
    sim = start_simulator("--profile", "pytorch-24g", "--time-scale", "0.2")
    try:
        out = tmp_path / "out"
        done = run_cli(["run", "--host", sim.url, "--scenario", "folder", "--images", str(docs), "--dpi", "100",
                        "--levels", "2", "--out", str(out), *SHORT], 150.0)  # fmt: skip
    finally:
        stop(sim.proc)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    (folder,) = [p for p in out.iterdir() if (p / "manifest.json").is_file()]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["documents"] == {"dpi": 100, "files": [
        {"file": "invoice.pdf", "pages": 2, "pages_sent": 2, "text_layer_pages": [1, 2]},
        {"file": "scan.tif", "pages": 2, "pages_sent": 2, "text_layer_pages": []}]}  # fmt: skip
    with (folder / "requests.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["phase"] == "step"]
    # 8.5 x 11 in at 100 DPI; the scan's two pages have the same pixels either way up: one band of sizes
    assert {r["bucket"] for r in rows} == {"850x1100", "500x700..700x500"}
    pdf = [r for r in rows if r["bucket"] == "850x1100"]
    assert pdf and all(r["cer"] != "" and float(r["cer"]) == 0.0 for r in pdf)  # the text layer, read back
    assert all(r["cer"] == "" for r in rows if r["bucket"] != "850x1100")  # a scan has no expected text
    assert all(r["status_code"] == "200" for r in rows)
