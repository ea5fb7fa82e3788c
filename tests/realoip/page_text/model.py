"""A small OCR stand-in served by MLServer (a real Open Inference Protocol server from PyPI): it decodes each
page (the BYTES input IMAGE, base64 that MLServer decodes itself), converts it to greyscale as a model's
preprocessing would (work that grows with the page's pixels), and answers the text the page carries in its
`ocr_text` PNG chunk (the suite's generated pages: scenarios/pages.py), as output TEXT. MLServer's adaptive
batching (model-settings.json: max_batch_size, max_batch_time) hands it several requests at once.

Runs inside MLServer's own venv (tests/realoip/setup_mlserver.sh): Pillow and MLServer only, no suite code.
"""

from __future__ import annotations

import io

from mlserver import MLModel
from mlserver.codecs import Base64Codec, StringCodec
from mlserver.types import InferenceRequest, InferenceResponse
from PIL import Image


class PageText(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        pages = Base64Codec.decode_input(payload.inputs[0])
        texts = [_read(page) for page in pages]
        return InferenceResponse(model_name=self.name, outputs=[StringCodec.encode_output("TEXT", texts)])


def _read(page: bytes) -> str:
    with Image.open(io.BytesIO(page)) as image:
        image.convert("L").getextrema()  # decode every pixel once, as a model's preprocessing would
        text = image.info.get("ocr_text", "")
    return text if isinstance(text, str) else ""
