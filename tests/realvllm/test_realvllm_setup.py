"""The real-vLLM set-up's pure parts, without vLLM: the torchvision guard and the tiny model's chat template.

Both run in the vLLM venv, where a mistake shows only after minutes of set-up and a server that does not
start (or answers without the image); here they are checked in milliseconds.
"""

from __future__ import annotations

import jinja2
from build_tiny_model import CHAT_TEMPLATE
from guard_torchvision import guard

# torchvision 0.28.0's _meta_registrations.py around the two registrations that fail without its ops
META_REGISTRATIONS = '''import torch
import torchvision.extension  # noqa: F401


@torch.library.register_fake("torchvision::nms")
def meta_nms(dets, scores, iou_threshold):
    return dets


@torch.library.register_fake("torchvision::qnms")
def meta_qnms(dets, scores, iou_threshold):
    return dets
'''


def test_guard_makes_both_registrations_conditional_on_the_ops() -> None:
    patched = guard(META_REGISTRATIONS)
    compile(patched, "_meta_registrations.py", "exec")
    for op in ("torchvision::nms", "torchvision::qnms"):
        assert f'@(torch.library.register_fake("{op}") if torchvision.extension._has_ops() else' in patched
    assert '@torch.library.register_fake("torchvision::nms")\n' not in patched


def test_guard_is_idempotent_and_leaves_other_text_alone() -> None:
    patched = guard(META_REGISTRATIONS)
    assert guard(patched) == patched
    assert guard("import torch\n") == "import torch\n"


def test_chat_template_puts_the_image_where_qwen2_vl_expects_it() -> None:
    # what vLLM's OpenAI server passes for a user message with an image_url part and a prompt
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:..."}},
                                             {"type": "text", "text": "Extract all text in the image."}]}]  # fmt: skip
    prompt = jinja2.Template(CHAT_TEMPLATE).render(messages=messages, add_generation_prompt=True)
    assert prompt == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Extract all text in the image.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
