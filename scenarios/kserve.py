"""The Open Inference Protocol (KServe v2: Triton, KServe, MLServer, OpenVINO Model Server): one page as a
BYTES tensor, the answer's text from a named output, and the tensor names read from the model's metadata.

Request (POST /v2/models/{model}/infer), encoded once per image:
- JSON (the default, what every v2 server accepts): `{"inputs": [{"name": IN, "shape": [1], "datatype":
  "BYTES", "data": ["<base64>"], "parameters": {"content_type": "base64"}}], "outputs": [{"name": OUT}]}`;
  MLServer decodes the base64 itself (its content type), Triton hands the model the base64 text.
- binary (Triton's binary tensor extension): the same JSON header with `"parameters": {"binary_data_size":
  N}` in place of `data`, then the tensor's raw bytes: one BYTES element is a 4-byte little-endian length
  and the image's bytes; the header's length goes in `Inference-Header-Content-Length`. The output is
  asked for as JSON (`binary_data: false`), so both answer alike.
Answer: `{"model_name", "outputs": [{"name", "datatype", "shape", "data": [...]}]}`; the text is the named
output's strings joined by newlines (an element that is itself JSON is walked as any JSON answer).
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass
from typing import Any

from scenarios.errors import AnswerError, ScenarioError

INFER_PATH = "/v2/models/{model}/infer"
HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass(frozen=True)
class KserveTensors:
    """The input tensor that carries the page, the output that holds the text, and the wire form."""

    input_name: str
    output_name: str = ""  # "" = the server's first BYTES output (none asked for by name)
    binary: bool = False  # Triton's binary tensor extension instead of base64 in JSON


def infer_path(model: str) -> str:
    if not model or "/" in model:
        raise ScenarioError(f"MODEL={model!r} must name the model as the server knows it (no '/'), e.g. ocr")
    return INFER_PATH.format(model=model)


def kserve_body(data: bytes, tensors: KserveTensors) -> tuple[bytes, str, tuple[tuple[str, str], ...]]:
    """The request body, its Content-Type and any header it needs, for one page (see module doc)."""
    if not tensors.input_name:
        raise ScenarioError("STYLE=kserve needs the input tensor's name: set KSERVE_INPUT (or let the pre-flight read it)")
    tensor: dict[str, Any] = {"name": tensors.input_name, "shape": [1], "datatype": "BYTES"}
    outputs: list[dict[str, Any]] = [{"name": tensors.output_name}] if tensors.output_name else []
    if not tensors.binary:
        tensor["data"] = [base64.b64encode(data).decode("ascii")]
        tensor["parameters"] = {"content_type": "base64"}
        body = {"inputs": [tensor], **({"outputs": outputs} if outputs else {})}
        return json.dumps(body).encode(), "application/json", ()
    element = struct.pack("<I", len(data)) + data
    tensor["parameters"] = {"binary_data_size": len(element)}
    for output in outputs:
        output["parameters"] = {"binary_data": False}
    header = json.dumps({"inputs": [tensor], **({"outputs": outputs} if outputs else {})}).encode()
    return header + element, "application/octet-stream", ((HEADER_LENGTH, str(len(header))),)


def kserve_text(answer: Any, output_name: str | None) -> list[Any]:
    """The named output's data (the first BYTES output, else the first output, when unnamed)."""
    outputs = answer.get("outputs") if isinstance(answer, dict) else None
    if not isinstance(outputs, list) or not outputs:
        raise AnswerError("not an Open Inference Protocol answer: no 'outputs' list")
    named = [o for o in outputs if isinstance(o, dict)]
    if output_name:
        found = [o for o in named if o.get("name") == output_name]
        if not found:
            names = ", ".join(str(o.get("name")) for o in named)
            raise AnswerError(f"the answer has no output {output_name!r} (it has {names}): set KSERVE_OUTPUT")
    else:
        found = [o for o in named if o.get("datatype") == "BYTES"] or named
    data = found[0].get("data") if found else None
    if not isinstance(data, list):
        raise AnswerError(f"output {found[0].get('name') if found else '?'!r} carries no JSON data (a binary output?)")
    return data


def pick_tensors(metadata: Any, input_name: str, output_name: str) -> tuple[str, str]:
    """The input and output names to use: the ones given, else read from the model's metadata
    (GET /v2/models/{name}): its only input, or its only BYTES one; the same for the output.
    Raises ScenarioError naming the choices when the metadata cannot decide."""
    if not isinstance(metadata, dict):
        metadata = {}
    return (
        input_name or _only_bytes(metadata.get("inputs"), "input", "KSERVE_INPUT"),
        output_name or _only_bytes(metadata.get("outputs"), "output", "KSERVE_OUTPUT"),
    )


def _only_bytes(tensors: Any, kind: str, setting: str) -> str:
    listed = [t for t in tensors if isinstance(t, dict) and t.get("name")] if isinstance(tensors, list) else []
    if len(listed) == 1:
        return str(listed[0]["name"])
    of_bytes = [t for t in listed if t.get("datatype") == "BYTES"]
    if len(of_bytes) == 1:
        return str(of_bytes[0]["name"])
    if not listed:
        raise ScenarioError(f"the model's metadata lists no {kind} tensor: set {setting}=<its name>")
    names = ", ".join(f"{t['name']} ({t.get('datatype', '?')})" for t in listed)
    raise ScenarioError(f"the model has several {kind}s ({names}): set {setting} to the one for the page")
