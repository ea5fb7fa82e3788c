"""STYLE=kserve: the page as a BYTES tensor (base64 in JSON, or the binary extension), the text from the
named output, the tensors' names from the model's metadata."""

from __future__ import annotations

import base64
import json
import struct

import pytest

from scenarios import AnswerError, ScenarioError, build_image_set, encode_request, extract_text, guess_style
from scenarios.kserve import HEADER_LENGTH, KserveTensors, pick_tensors

ITEM = build_image_set("fixed").items[0]


def _answer(*outputs: tuple[str, str, list[object]]) -> bytes:
    return json.dumps({"model_name": "ocr", "model_version": "1",
                       "outputs": [{"name": n, "datatype": d, "shape": [1], "data": v} for n, d, v in outputs]}).encode()  # fmt: skip


def test_json_request_carries_the_page_base64_with_its_content_type() -> None:
    enc = encode_request(ITEM, "kserve", model="ocr", tensors=KserveTensors("IMAGE", "TEXT"))
    assert (enc.path, enc.content_type, enc.headers) == ("/v2/models/ocr/infer", "application/json", ())
    body = json.loads(enc.body)
    (tensor,) = body["inputs"]
    assert tensor["name"] == "IMAGE" and tensor["datatype"] == "BYTES" and tensor["shape"] == [1]
    assert tensor["parameters"] == {"content_type": "base64"}
    assert base64.b64decode(tensor["data"][0]) == ITEM.data
    assert body["outputs"] == [{"name": "TEXT"}]


def test_binary_request_is_the_json_header_then_one_length_prefixed_element() -> None:
    enc = encode_request(ITEM, "kserve", model="ocr", tensors=KserveTensors("IMAGE", "TEXT", binary=True))
    (name, length), = enc.headers
    header_len = int(length)
    assert name == HEADER_LENGTH and enc.content_type == "application/octet-stream"
    header = json.loads(enc.body[:header_len])
    tail = enc.body[header_len:]
    assert header["inputs"][0]["parameters"] == {"binary_data_size": len(tail)}
    assert "data" not in header["inputs"][0]
    assert header["outputs"] == [{"name": "TEXT", "parameters": {"binary_data": False}}]
    assert struct.unpack_from("<I", tail)[0] == len(ITEM.data) and tail[4:] == ITEM.data


def test_bad_kserve_options_are_one_line() -> None:
    with pytest.raises(ScenarioError, match="KSERVE_INPUT"):
        encode_request(ITEM, "kserve", model="ocr", tensors=None)
    with pytest.raises(ScenarioError, match="MODEL"):
        encode_request(ITEM, "kserve", model="a/b", tensors=KserveTensors("IMAGE"))
    with pytest.raises(ScenarioError, match="drop FIELD"):
        encode_request(ITEM, "kserve", model="ocr", field="file", tensors=KserveTensors("IMAGE"))


def test_the_text_is_read_from_the_named_output() -> None:
    body = _answer(("SCORES", "FP32", [0.9]), ("TEXT", "BYTES", ["line one", "line two"]), ("BOXES", "BYTES", ["x"]))
    assert extract_text("kserve", body, output="TEXT") == "line one\nline two"
    assert extract_text("kserve", body) == "line one\nline two"  # unnamed: the first BYTES output
    with pytest.raises(AnswerError, match="KSERVE_OUTPUT"):
        extract_text("kserve", body, output="RESULT")
    with pytest.raises(AnswerError, match="outputs"):
        extract_text("kserve", b'{"text": "hello"}')


def test_an_output_element_that_is_json_is_walked_for_its_text() -> None:
    pipeline = json.dumps({"rec_texts": ["Invoice", "Total 5"], "rec_scores": [0.9, 0.8]})
    assert extract_text("kserve", _answer(("result", "BYTES", [pipeline]))) == "Invoice\nTotal 5"


def test_guess_style_knows_an_open_inference_protocol_answer() -> None:
    assert guess_style(_answer(("TEXT", "BYTES", ["hi"])), "application/json") == "kserve"


def test_tensor_names_come_from_the_metadata_or_a_line_naming_the_choices() -> None:
    meta = {"inputs": [{"name": "IMAGE", "datatype": "BYTES"}, {"name": "LANG", "datatype": "INT32"}],
            "outputs": [{"name": "TEXT", "datatype": "BYTES"}]}  # fmt: skip
    assert pick_tensors(meta, "", "") == ("IMAGE", "TEXT")
    assert pick_tensors(meta, "LANG", "OUT") == ("LANG", "OUT")
    two = {"inputs": [{"name": "A", "datatype": "BYTES"}, {"name": "B", "datatype": "BYTES"}], "outputs": []}
    with pytest.raises(ScenarioError, match=r"several inputs \(A \(BYTES\), B \(BYTES\)\).*KSERVE_INPUT"):
        pick_tensors(two, "", "T")
    with pytest.raises(ScenarioError, match="no output tensor.*KSERVE_OUTPUT"):
        pick_tensors(two, "A", "")
