"""The user's own images: folders, expected texts, and every bad input as one clear ScenarioError line."""

from __future__ import annotations

import io
import json
import struct
import time
import zlib
from pathlib import Path

import pytest
from PIL import Image

from scenarios import ScenarioError, build_image_set, make_document_image


def _png(path: Path, size: tuple[int, int] = (40, 30), color: str = "white") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, "PNG")
    path.write_bytes(out.getvalue())
    return out.getvalue()


def _declared_png(width_px: int, height_px: int) -> bytes:
    """A few hundred bytes that claim to be a width x height PNG (a decompression bomb's header)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width_px, height_px, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + chunk(b"IEND", b"")
    )


def _error(scenario: str, **kwargs: object) -> str:
    with pytest.raises(ScenarioError) as err:
        build_image_set(scenario, **kwargs)  # type: ignore[arg-type]
    message = str(err.value)
    assert "\n" not in message
    assert isinstance(err.value, ValueError)
    return message


def test_folder_reads_every_image_with_its_expected_text(tmp_path: Path) -> None:
    a = _png(tmp_path / "a.png")
    _png(tmp_path / "b.png", (50, 20))
    (tmp_path / "a.txt").write_text("text of a", encoding="utf-8")
    (tmp_path / "b.png.txt").write_text("text of b", encoding="utf-8")
    generated = make_document_image(300, 200, seed=1, fmt="JPEG")
    (tmp_path / "c.jpg").write_bytes(generated.data)
    _png(tmp_path / "d.png")
    (tmp_path / "d.txt").write_text("sidecar of d", encoding="utf-8")
    (tmp_path / "expected.json").write_text(json.dumps({"d.png": "json wins for d"}), encoding="utf-8")
    (tmp_path / ".DS_Store").write_bytes(b"\x00junk")
    (tmp_path / "sub").mkdir()
    _png(tmp_path / "sub" / "ignored.png")

    image_set = build_image_set("folder", images=str(tmp_path))
    by_name = {item.name: item for item in image_set.items}
    assert list(by_name) == ["a.png", "b.png", "c.jpg", "d.png"]
    assert by_name["a.png"].data == a  # the file's own bytes, not re-encoded
    assert by_name["a.png"].expected_text == "text of a"
    assert by_name["b.png"].expected_text == "text of b"
    assert by_name["b.png"].bucket == "50x20..40x30"  # a band with a's and d's 40x30: 1.2x its pixels
    assert by_name["c.jpg"].expected_text == generated.expected_text  # from the JPEG comment
    assert by_name["c.jpg"].mime == "image/jpeg"
    assert by_name["d.png"].expected_text == "json wins for d"
    assert image_set.weights == (1.0, 1.0, 1.0, 1.0)


def test_folder_images_without_truth_have_none(tmp_path: Path) -> None:
    _png(tmp_path / "only.png")
    (item,) = build_image_set("folder", images=str(tmp_path)).items
    assert item.expected_text is None


def test_fixed_soak_and_retry_take_the_users_file_or_folder(tmp_path: Path) -> None:
    data = _png(tmp_path / "page.png")
    assert build_image_set("fixed", images=str(tmp_path / "page.png")).items[0].data == data
    assert build_image_set("soak", images=str(tmp_path / "page.png")).items[0].data == data
    assert [i.name for i in build_image_set("retry", images=str(tmp_path)).items] == ["page.png"]


def test_unknown_scenario_lists_the_choices() -> None:
    message = _error("burst")
    assert "unknown scenario 'burst'" in message
    assert "fixed, mixed, large, folder, soak, retry" in message


def test_missing_path_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.png"
    assert str(missing) in _error("fixed", images=str(missing))
    assert str(tmp_path / "nodir") in _error("folder", images=str(tmp_path / "nodir"))


def test_empty_folder_is_named(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("sidecars alone are not images", encoding="utf-8")
    message = _error("folder", images=str(tmp_path))
    assert str(tmp_path) in message
    assert "has no images" in message


def test_zero_byte_file_is_named(tmp_path: Path) -> None:
    _png(tmp_path / "good.png")
    (tmp_path / "empty.png").write_bytes(b"")
    message = _error("folder", images=str(tmp_path))
    assert str(tmp_path / "empty.png") in message
    assert "0 bytes" in message


def test_non_image_file_is_named(tmp_path: Path) -> None:
    _png(tmp_path / "good.png")
    (tmp_path / "README.md").write_text("# not an image", encoding="utf-8")
    message = _error("folder", images=str(tmp_path))
    assert str(tmp_path / "README.md") in message
    assert "not an image" in message


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    _png(tmp_path / "good.png")
    (tmp_path / "gone.png").symlink_to(tmp_path / "deleted-target.png")
    message = _error("folder", images=str(tmp_path))
    assert str(tmp_path / "gone.png") in message
    assert "broken link" in message


def test_truncated_image_is_named(tmp_path: Path) -> None:
    out = io.BytesIO()
    Image.effect_noise((200, 200), 60).convert("RGB").save(out, "PNG")
    (tmp_path / "cut.png").write_bytes(out.getvalue()[: len(out.getvalue()) // 2])
    message = _error("fixed", images=str(tmp_path / "cut.png"))
    assert str(tmp_path / "cut.png") in message
    assert "truncated or corrupt" in message


def test_image_over_max_pixels_is_named(tmp_path: Path) -> None:
    _png(tmp_path / "big.png", (400, 300))
    message = _error("fixed", images=str(tmp_path / "big.png"), max_pixels=100_000)
    assert str(tmp_path / "big.png") in message
    assert "400x300" in message
    assert "max_pixels" in message


@pytest.mark.parametrize("size", [(10_000, 6_000), (10_000, 10_000)])
def test_decompression_bomb_is_refused_from_its_header(tmp_path: Path, size: tuple[int, int]) -> None:
    # 60 and 100 Mpx declared in ~100 bytes: decoding would need hundreds of MB and then fail as corrupt,
    # so the size message (not "truncated or corrupt") proves the header was checked first. 100 Mpx also
    # passes Pillow's own warning threshold, which must not escape (warnings are errors here).
    path = tmp_path / "bomb.png"
    path.write_bytes(_declared_png(*size))
    start = time.perf_counter()
    message = _error("fixed", images=str(path))
    assert time.perf_counter() - start < 1.0
    assert str(path) in message
    assert f"{size[0]}x{size[1]}" in message
    assert "decompression bomb" in message


def test_huge_declared_size_beyond_pillows_own_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bomb.png"
    path.write_bytes(_declared_png(100_000, 100_000))
    message = _error("folder", images=str(tmp_path), max_pixels=10**12)
    assert str(path) in message
    assert "decompression bomb" in message


def test_bad_expected_json_is_named(tmp_path: Path) -> None:
    _png(tmp_path / "a.png")
    expected = tmp_path / "expected.json"
    expected.write_text("{not json", encoding="utf-8")
    assert str(expected) in _error("folder", images=str(tmp_path))
    expected.write_text(json.dumps(["a.png"]), encoding="utf-8")
    assert "file name to text" in _error("folder", images=str(tmp_path))
    expected.write_text(json.dumps({"a.png": "x", "typo.png": "y"}), encoding="utf-8")
    assert "typo.png" in _error("folder", images=str(tmp_path))


def test_flags_that_do_not_fit_the_scenario_are_refused(tmp_path: Path) -> None:
    _png(tmp_path / "a.png")
    assert "SCENARIO=folder" in _error("fixed", images=str(tmp_path))
    assert "needs IMAGES" in _error("folder")
    assert "drop IMAGES" in _error("mixed", images=str(tmp_path))
    assert "drop IMAGES" in _error("large", images=str(tmp_path / "a.png"))
    assert "only to SCENARIO=mixed" in _error("fixed", buckets="640x480:1")
    assert "max_pixels" in _error("fixed", max_pixels=0)
    assert "variants" in _error("fixed", variants=0)
