"""Image sets, request encoders and answer parsing for the load test (stdlib + Pillow only)."""

from scenarios.answers import (
    character_error_rate,
    extract_finish_reason,
    extract_text,
    extract_usage,
    guess_style,
    levenshtein,
)
from scenarios.errors import AnswerError, ScenarioError
from scenarios.images import (
    DEFAULT_BUCKETS,
    SCENARIOS,
    Bucket,
    ImageItem,
    ImageSet,
    build_image_set,
    make_document_image,
    parse_buckets,
)
from scenarios.pages import TEXT_KEY, read_ground_truth
from scenarios.runaway import repeated_tail
from scenarios.styles import (
    DEFAULT_ENDPOINTS,
    DEFAULT_FIELDS,
    STYLES,
    EncodedRequest,
    data_uri,
    encode_request,
)
from scenarios.wire import decode_image_set, encode_image_set
from scenarios.wire import digest as image_set_digest

__all__ = [
    "DEFAULT_BUCKETS",
    "DEFAULT_ENDPOINTS",
    "DEFAULT_FIELDS",
    "SCENARIOS",
    "STYLES",
    "TEXT_KEY",
    "AnswerError",
    "Bucket",
    "EncodedRequest",
    "ImageItem",
    "ImageSet",
    "ScenarioError",
    "build_image_set",
    "character_error_rate",
    "data_uri",
    "decode_image_set",
    "encode_image_set",
    "encode_request",
    "extract_finish_reason",
    "extract_text",
    "extract_usage",
    "guess_style",
    "image_set_digest",
    "levenshtein",
    "make_document_image",
    "parse_buckets",
    "read_ground_truth",
    "repeated_tail",
]
