"""Generated pages and image sets: determinism, ground truth, buckets, weighted picking."""

from __future__ import annotations

import hashlib
import io
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from scenarios import (
    DEFAULT_BUCKETS,
    ImageItem,
    ImageSet,
    ScenarioError,
    build_image_set,
    make_document_image,
    pages,
    parse_buckets,
    read_ground_truth,
)

ROOT = Path(__file__).resolve().parents[2]


def test_same_seed_gives_same_bytes_even_without_the_cache() -> None:
    first = make_document_image(640, 480, seed=7)
    pages._make_cached.cache_clear()
    second = make_document_image(640, 480, seed=7)
    assert first is not second
    assert first.data == second.data
    assert first.expected_text == second.expected_text


def test_same_seed_gives_same_bytes_in_another_process() -> None:
    code = (
        "import hashlib; from scenarios import make_document_image as m;"
        "print(hashlib.sha256(m(640, 480, seed=7).data).hexdigest())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == hashlib.sha256(make_document_image(640, 480, seed=7).data).hexdigest()


def test_different_seeds_give_different_pages() -> None:
    a = make_document_image(640, 480, seed=1)
    b = make_document_image(640, 480, seed=2)
    assert a.data != b.data
    assert a.expected_text != b.expected_text


def test_png_carries_its_text_in_a_text_chunk() -> None:
    item = make_document_image(1000, 700, seed=0)
    with Image.open(io.BytesIO(item.data)) as im:
        assert im.format == "PNG"
        assert im.size == (1000, 700)
        assert im.text["ocr_text"] == item.expected_text
        im.load()
        assert im.convert("L").getextrema()[0] < 80  # dark ink is really drawn
    assert item.mime == "image/png"
    assert item.bucket == "1000x700"
    assert item.expected_text and len(item.expected_text.split()) > 50


def test_jpeg_carries_its_text_in_a_comment() -> None:
    item = make_document_image(800, 600, seed=3, fmt="JPEG", layout="photo")
    with Image.open(io.BytesIO(item.data)) as im:
        assert im.format == "JPEG"
        assert im.info["comment"] == b"ocr_text:" + (item.expected_text or "").encode()
    assert item.mime == "image/jpeg"
    assert read_ground_truth(item.data) == item.expected_text


def test_given_text_round_trips_including_non_latin1() -> None:
    text = "Total due: 12.50 €\nnaïve café – thank you"
    for fmt in ("PNG", "JPEG"):
        item = make_document_image(1200, 400, seed=0, text=text, fmt=fmt)
        assert item.expected_text == text
        assert read_ground_truth(item.data) == text


def test_long_given_text_wraps_and_too_long_text_is_refused() -> None:
    item = make_document_image(400, 600, seed=0, text="word " * 30)
    assert item.expected_text is not None
    assert item.expected_text.count("\n") >= 2
    assert item.expected_text.split() == ["word"] * 30
    with pytest.raises(ScenarioError, match="larger page or shorter text"):
        make_document_image(200, 100, seed=0, text="word " * 500)


def test_receipt_lines_end_in_prices() -> None:
    item = make_document_image(540, 2000, seed=5, layout="receipt")
    lines = (item.expected_text or "").splitlines()
    assert len(lines) > 20
    assert all(line.rsplit(" ", 1)[1].replace(".", "").isdigit() for line in lines)


def test_read_ground_truth_is_none_for_plain_images() -> None:
    out = io.BytesIO()
    Image.new("RGB", (10, 10), "white").save(out, "PNG")
    assert read_ground_truth(out.getvalue()) is None
    assert read_ground_truth(b"not an image") is None


def test_bad_generation_arguments_raise_scenario_error() -> None:
    with pytest.raises(ScenarioError, match="PNG or JPEG"):
        make_document_image(100, 100, seed=0, fmt="GIF")
    with pytest.raises(ScenarioError, match="layout"):
        make_document_image(100, 100, seed=0, layout="poster")
    with pytest.raises(ScenarioError, match="at least 1 px"):
        make_document_image(0, 100, seed=0)


def test_large_page_is_generated_quickly() -> None:
    pages._make_cached.cache_clear()
    start = time.perf_counter()
    item = make_document_image(4000, 3000, seed=11)
    elapsed_s = time.perf_counter() - start
    assert (item.width_px, item.height_px) == (4000, 3000)
    assert elapsed_s < 5.0  # goal is well under 2 s; margin for a busy 2-core test machine


def test_parse_buckets_reads_sizes_and_weights() -> None:
    buckets = parse_buckets(DEFAULT_BUCKETS)
    assert [(b.name, b.weight) for b in buckets] == [
        ("640x480", 4.0),
        ("1024x768", 3.0),
        ("2048x1536", 2.0),
        ("4000x3000", 1.0),
    ]
    loose = parse_buckets(" 800X600 , 1024x768:0.5, 320x240:0 ,")
    assert [(b.width_px, b.height_px, b.weight) for b in loose] == [(800, 600, 1.0), (1024, 768, 0.5)]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "640x",
        "axb:1",
        "640x480:-1",
        "640x480:abc",
        "0x480:1",
        "640x480:1,640x480:2",
        "640x480:0",
        "640*480",
    ],
)
def test_bad_buckets_text_raises_one_line_scenario_error(text: str) -> None:
    with pytest.raises(ScenarioError) as err:
        parse_buckets(text)
    assert "\n" not in str(err.value)
    with pytest.raises(ScenarioError):
        build_image_set("mixed", buckets=text)


def _fake_item(name: str, weight: float) -> ImageItem:
    return ImageItem(name, "1x1", 1, 1, name.encode(), "image/png", None, weight)


def test_pick_follows_the_weights() -> None:
    weights = (4.0, 3.0, 2.0, 1.0)
    image_set = ImageSet("mixed", tuple(_fake_item(str(i), w) for i, w in enumerate(weights)), weights)
    rng = random.Random(42)
    n = 20_000
    counts = Counter(image_set.pick(rng).name for _ in range(n))
    for i, w in enumerate(weights):
        assert counts[str(i)] / n == pytest.approx(w / sum(weights), abs=0.02)


def test_pick_is_reproducible_and_skips_zero_weights() -> None:
    image_set = ImageSet("x", (_fake_item("a", 1), _fake_item("b", 0), _fake_item("c", 1)), (1.0, 0.0, 1.0))
    first = [image_set.pick(random.Random(3)).name for _ in range(5)]
    assert first == [image_set.pick(random.Random(3)).name for _ in range(5)]
    rng = random.Random(9)
    assert "b" not in {image_set.pick(rng).name for _ in range(2000)}


def test_image_set_refuses_bad_weights() -> None:
    item = _fake_item("a", 1)
    with pytest.raises(ScenarioError):
        ImageSet("x", (), ())
    with pytest.raises(ScenarioError):
        ImageSet("x", (item,), (1.0, 2.0))
    with pytest.raises(ScenarioError):
        ImageSet("x", (item,), (0.0,))


def test_fixed_soak_and_retry_send_the_same_generated_page() -> None:
    fixed = build_image_set("fixed", seed=4)
    assert len(fixed.items) == 1
    assert fixed.items[0].bucket == "1000x700"
    assert fixed.items[0].expected_text
    for name in ("soak", "retry", " Fixed "):
        other = build_image_set(name, seed=4)
        assert other.items[0].data == fixed.items[0].data
    assert build_image_set("soak", seed=4).scenario == "soak"


def test_mixed_uses_weighted_buckets() -> None:
    default = build_image_set("mixed", seed=0)
    assert default.buckets == ("640x480", "1024x768", "2048x1536", "4000x3000")
    assert default.weights == (4.0, 3.0, 2.0, 1.0)
    custom = build_image_set("mixed", buckets="320x240:1,800x600:3")
    assert custom.buckets == ("320x240", "800x600")
    assert [(i.width_px, i.height_px) for i in custom.items] == [(320, 240), (800, 600)]
    assert custom.weights == (1.0, 3.0)


def test_variants_split_each_bucket_weight() -> None:
    image_set = build_image_set("mixed", buckets="320x240:3,400x300:1", variants=3)
    assert len(image_set.items) == 6
    assert len({i.data for i in image_set.items}) == 6
    assert (
        sum(w for i, w in zip(image_set.items, image_set.weights, strict=True) if i.bucket == "320x240")
        == 3.0
    )


def test_large_has_a_long_receipt_and_a_photo() -> None:
    image_set = build_image_set("large")
    assert image_set.buckets == ("1080x8000", "4000x3000")
    receipt, photo = image_set.items
    assert receipt.mime == "image/png"
    assert photo.mime == "image/jpeg"
    assert read_ground_truth(photo.data) == photo.expected_text


def test_bucket_over_max_pixels_is_refused_before_drawing() -> None:
    start = time.perf_counter()
    with pytest.raises(ScenarioError, match="100000x100000 is 10000.0 Mpx, over the limit of 50 Mpx"):
        build_image_set("mixed", buckets="640x480:1,100000x100000:1")
    with pytest.raises(ScenarioError, match="over the limit"):
        build_image_set("fixed", max_pixels=1000)
    assert time.perf_counter() - start < 1.0


def test_a_folder_of_slightly_differing_scans_makes_a_few_bands_named_by_their_range(tmp_path: Path) -> None:
    sizes = {"a.png": (1000, 1400), "b.png": (1010, 1420), "c.png": (1100, 1500), "d.png": (2000, 2800),
             "e.png": (2040, 2800), "f.png": (600, 800), "g.png": (600, 800)}  # fmt: skip
    for name, size in sizes.items():
        Image.new("RGB", size, "white").save(tmp_path / name)
    image_set = build_image_set("folder", str(tmp_path))
    bucket = {item.name: item.bucket for item in image_set.items}
    # a, b, c within 30% more pixels than a (1.18x); d and e (2.0x a); f and g one size: keeps its name
    assert bucket == {"a.png": "1000x1400..1100x1500", "b.png": "1000x1400..1100x1500", "c.png": "1000x1400..1100x1500",
                      "d.png": "2000x2800..2040x2800", "e.png": "2000x2800..2040x2800", "f.png": "600x800",
                      "g.png": "600x800"}  # fmt: skip
    # each band is sent alone as its largest page, fewest pixels first
    assert [item.name for item in image_set.by_size()] == ["f.png", "c.png", "e.png"]
    assert image_set.size_weights() == pytest.approx({"1000x1400..1100x1500": 3 / 7, "2000x2800..2040x2800": 2 / 7,
                                                      "600x800": 2 / 7})  # fmt: skip
