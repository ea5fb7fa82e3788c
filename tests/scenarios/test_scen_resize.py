"""MAX_SIDE: images resized on the driver, aspect kept, ground truth kept, sizes recorded; bad values one line."""

from __future__ import annotations

import dataclasses
import io

import pytest
from PIL import Image

from loadtest.settings.checks import ConfigError
from loadtest.settings.run_config import RunConfig
from loadtest.traffic.payloads import build_payloads, image_set_for, images_sent
from scenarios import build_image_set, make_document_image, read_ground_truth
from scenarios.resize import fit_within, resize_image_set, resize_item


def size_of(data: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(data)) as im:
        return im.size


@pytest.mark.parametrize(
    ("size", "max_side", "expected"),
    [
        ((4000, 3000), 1024, (1024, 768)),
        ((1080, 8000), 1024, (138, 1024)),
        ((1000, 700), 1024, (1000, 700)),  # already within: untouched
        ((1024, 10), 1024, (1024, 10)),
        ((5000, 1), 1000, (1000, 1)),  # never a side of 0
        ((4000, 3000), 0, (4000, 3000)),  # 0 is off
    ],
)
def test_fit_within_keeps_the_aspect_and_bounds_the_longest_side(size, max_side, expected):
    assert fit_within(*size, max_side) == expected


def test_a_generated_page_is_resized_with_its_ground_truth_and_format():
    page = make_document_image(2048, 1536, seed=3)
    small = resize_item(page, 1024)
    assert (small.width_px, small.height_px) == (1024, 768) == size_of(small.data)
    assert small.mime == "image/png" and small.name == page.name and small.bucket == page.bucket
    assert read_ground_truth(small.data) == page.expected_text == small.expected_text
    assert len(small.data) < len(page.data)


def test_a_jpeg_photo_stays_jpeg_with_its_comment():
    photo = make_document_image(4000, 3000, seed=1, fmt="JPEG", layout="photo")
    small = resize_item(photo, 1024)
    assert small.mime == "image/jpeg" and size_of(small.data) == (1024, 768)
    assert read_ground_truth(small.data) == photo.expected_text


def test_an_image_within_the_limit_is_sent_as_it_is():
    page = make_document_image(1000, 700, seed=0)
    assert resize_item(page, 1024) is page


def test_the_set_records_sizes_before_and_after_and_keeps_weights():
    image_set = build_image_set("mixed", buckets="640x480:4,4000x3000:1")
    resized, changes = resize_image_set(image_set, 1024)
    assert resized.weights == image_set.weights
    assert [(c.bucket, c.before_px, c.after_px) for c in changes] == [
        ("640x480", (640, 480), (640, 480)),
        ("4000x3000", (4000, 3000), (1024, 768)),
    ]
    assert changes[0].bytes_before == changes[0].bytes_after
    assert changes[1].bytes_after == len(resized.items[1].data) < changes[1].bytes_before


def test_the_run_sends_the_resized_images_and_the_manifest_says_so():
    cfg = RunConfig(host="http://127.0.0.1:1", scenario="large", max_side=1024)
    assert {(i.width_px, i.height_px) for i in image_set_for(cfg).items} == {(138, 1024), (1024, 768)}
    payloads = build_payloads(cfg)
    sent = images_sent(cfg)["images_sent"]
    assert sent["max_side_px"] == 1024
    for size in sent["sizes"]:
        item = next(i for i in payloads.image_set.items if i.bucket == size["bucket"])
        assert size["after_px"] == [item.width_px, item.height_px] and size["bytes"] == len(item.data)
        assert max(size["before_px"]) > 1024
    assert images_sent(dataclasses.replace(cfg, max_side=0)) == {}


@pytest.mark.parametrize("value", [-1, 5])
def test_a_bad_max_side_is_one_line(value):
    with pytest.raises(ConfigError, match=r"^bad MAX_SIDE=-?\d+: give the longest side in px") as info:
        RunConfig(max_side=value).checked()
    assert "\n" not in str(info.value)
