"""The Open Inference Protocol (KServe v2) as Triton speaks it: the infer body read, the model's metadata and
config, the answer. The model takes one BYTES input `IMAGE` (the page: base64 text with the
`content_type: base64` parameter, or raw bytes with the binary tensor extension) and answers one BYTES
output `TEXT`. Errors are `BadInput` (Triton answers `{"error": "..."}` with 400)."""

from __future__ import annotations

import base64
import binascii
import json
import struct
from typing import Any

from simulator.front.images import BadInput
from simulator.model.profiles import Profile

INPUT_NAME, OUTPUT_NAME = "IMAGE", "TEXT"
HEADER_LENGTH = "Inference-Header-Content-Length"
VERSION = "1"


def image_of_infer(raw: bytes, header_length: str | None) -> bytes:
    """The page in an infer request: the first element of input IMAGE, from JSON or the binary extension."""
    json_len = _header_length(header_length, len(raw))
    try:
        header = json.loads(raw[:json_len])
    except (ValueError, UnicodeDecodeError):
        raise BadInput(400, "failed to parse the request JSON buffer") from None
    inputs = header.get("inputs") if isinstance(header, dict) else None
    tensor = next((t for t in inputs or [] if isinstance(t, dict) and t.get("name") == INPUT_NAME), None)
    if tensor is None:
        raise BadInput(400, f"expected input '{INPUT_NAME}' for the model, not found in the request")
    if tensor.get("datatype") != "BYTES":
        raise BadInput(400, f"input '{INPUT_NAME}' has datatype {tensor.get('datatype')}, the model expects BYTES")
    params = tensor.get("parameters") or {}
    if "binary_data_size" in params:
        return _binary_element(raw[json_len:], int(params["binary_data_size"]))
    data = tensor.get("data")
    while isinstance(data, list) and data:
        data = data[0]
    if not isinstance(data, str) or not data:
        raise BadInput(400, f"input '{INPUT_NAME}' carries no data")
    if params.get("content_type") != "base64":  # Triton hands the model the text as it came
        return data.encode()
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise BadInput(400, f"input '{INPUT_NAME}' says content_type base64 but is not base64") from None


def _header_length(value: str | None, body_len: int) -> int:
    if value is None:
        return body_len
    try:
        n = int(value)
    except ValueError:
        raise BadInput(400, f"{HEADER_LENGTH} must be a number of bytes") from None
    if not 0 < n <= body_len:
        raise BadInput(400, f"{HEADER_LENGTH} {n} does not fit a body of {body_len} bytes")
    return n


def _binary_element(tail: bytes, size: int) -> bytes:
    """One BYTES element of the binary extension: a 4-byte little-endian length, then the bytes."""
    if size != len(tail) or size < 4:
        raise BadInput(400, f"binary_data_size {size} but {len(tail)} bytes follow the JSON header")
    (n,) = struct.unpack_from("<I", tail)
    if n != size - 4:
        raise BadInput(400, f"the BYTES element says {n} bytes, {size - 4} sent")
    return tail[4:]


def model_metadata(profile: Profile) -> dict[str, Any]:
    """GET /v2/models/{name}."""
    return {
        "name": profile.model_name,
        "versions": [VERSION],
        "platform": "python",
        "inputs": [{"name": INPUT_NAME, "datatype": "BYTES", "shape": [-1, 1]}],
        "outputs": [{"name": OUTPUT_NAME, "datatype": "BYTES", "shape": [-1, 1]}],
    }


def model_config(profile: Profile) -> dict[str, Any]:
    """GET /v2/models/{name}/config, Triton's model configuration as JSON (a subset)."""
    return {
        "name": profile.model_name,
        "platform": "",
        "backend": "python",
        "max_batch_size": profile.max_batch,
        "input": [{"name": INPUT_NAME, "data_type": "TYPE_STRING", "dims": [1]}],
        "output": [{"name": OUTPUT_NAME, "data_type": "TYPE_STRING", "dims": [1]}],
        "instance_group": [{"name": profile.model_name, "kind": "KIND_GPU", "count": profile.instances, "gpus": [0]}],
        "dynamic_batching": {
            "preferred_batch_size": [],
            "max_queue_delay_microseconds": round(profile.max_queue_delay_ms * 1000),
        },
    }


def infer_answer(profile: Profile, text: str) -> dict[str, Any]:
    return {
        "model_name": profile.model_name,
        "model_version": VERSION,
        "outputs": [{"name": OUTPUT_NAME, "datatype": "BYTES", "shape": [1, 1], "data": [text]}],
    }
