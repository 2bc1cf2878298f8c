"""Build a tiny, randomly initialised olmOCR-shaped model, offline: ``python tiny_model.py OUTPUT_DIR``.

Run by ``server.build_tiny_model`` with the vLLM virtualenv's Python (it needs torch, transformers and
tokenizers, which Airflow's virtualenv does not have). The model has olmOCR-2's architecture
(``Qwen2_5_VLForConditionalGeneration``) at ~1 M parameters: hidden size 128, 2 layers, 2 heads over
1 KV head, head size 64 (a size vLLM's CPU attention supports); a 2-block vision tower with Qwen2-VL's
14 px patches merged 2 by 2, and Qwen2.5-VL's image size limits (3,136 to 12,845,056 pixels, which
olmOCR's model keeps), so a page image costs as many prompt tokens as with the real model.
The tokenizer is a byte-level BPE trained here on a small generated corpus plus Qwen2-VL's 22 special
tokens, with Qwen2-VL's chat template: any text can be encoded, so guided decoding can always produce
olmOCR's front matter.

Weights are random (seeded) but for one residual dimension held constant through the layers, which the
output head reads as a strong vote for the end of the answer and a weaker one for ``True``: unconstrained,
the model answers at once with nothing (so olmOCR's front-matter parser rejects it); constrained to
olmOCR's front matter (guided decoding), it fills the fields, says its rotation is valid and stops as
soon as the grammar allows, so its pages pass the parser. ``min_tokens`` makes it talk for a given length
(random text) where a test needs a long or length-limited answer.
"""

from __future__ import annotations

import sys
from pathlib import Path

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
]

# Qwen2-VL's chat template, reduced to what olmOCR sends (user messages of text and image parts).
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen2.5-VL's preprocessor_config (min_pixels, max_pixels): an image is scaled into this many pixels.
# transformers' own default keeps at most 1,003,520, which would shrink a 1,288 px page.
IMAGE_PIXELS = {"shortest_edge": 3136, "longest_edge": 12845056}
VOCAB_TRAINED = 4000
HIDDEN = 128
HEADS, KV_HEADS = 2, 1
# The residual dimension no layer writes to, its value in every token embedding, and the output head's
# weights on it for the end of the answer and for "True" (other logits stay within about +-1).
STEADY_DIM, STEADY_VALUE = 0, 0.05
END_WEIGHT, TRUE_WEIGHT = 40.0, 20.0


def corpus() -> list[str]:
    """Training text: olmOCR's front matter and prompt words, and the docstrings of a few stdlib modules
    (the same on every machine with this Python)."""
    import collections
    import json
    import string
    import textwrap

    lines = [
        "---\nprimary_language: en\nis_rotation_valid: True\nrotation_correction: 0\n"
        "is_table: False\nis_diagram: False\n---\n",
        "Attached is one page of a document that you must process. Just return the plain text "
        "representation of this document as if you were reading it naturally. Convert equations to "
        "LateX and tables to HTML.",
        string.printable,
    ]
    for module in (collections, json, string, textwrap, str, dict, list):
        for name in dir(module):
            doc = getattr(getattr(module, name, None), "__doc__", None)
            if isinstance(doc, str):
                lines.append(doc)
    return lines


def build(output: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_TRAINED,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
        model_max_length=32768,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    token_id = tokenizer.convert_tokens_to_ids
    # vLLM pads the embedding to a multiple of 64 on some paths; the checkpoint says so up front.
    vocab_size = -(-len(tokenizer) // 64) * 64

    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": vocab_size,
            "hidden_size": HIDDEN,
            "intermediate_size": 2 * HIDDEN,
            "num_hidden_layers": 2,
            "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS,
            "max_position_embeddings": 32768,
            "rope_theta": 1000000.0,
            # Sections of the rotary half (head size 64 / 2) for time, height and width, as Qwen2.5-VL.
            "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12]},
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "bos_token_id": token_id("<|endoftext|>"),
            "eos_token_id": token_id("<|im_end|>"),
            "pad_token_id": token_id("<|endoftext|>"),
        },
        vision_config={
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 112,
            "fullatt_block_indexes": [1],
            "out_hidden_size": HIDDEN,
            "in_chans": 3,
        },
        image_token_id=token_id("<|image_pad|>"),
        video_token_id=token_id("<|video_pad|>"),
        vision_start_token_id=token_id("<|vision_start|>"),
        vision_end_token_id=token_id("<|vision_end|>"),
        bos_token_id=token_id("<|endoftext|>"),
        eos_token_id=token_id("<|im_end|>"),
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(config)
    true_tokens = [
        index
        for token, index in tokenizer.get_vocab().items()
        if tokenizer.convert_tokens_to_string([token]).strip() == "True"
    ]
    steer(model, end_tokens=[token_id("<|im_end|>"), token_id("<|endoftext|>")], true_tokens=true_tokens)
    model = model.to(torch.bfloat16)
    model.generation_config.eos_token_id = [token_id("<|im_end|>"), token_id("<|endoftext|>")]
    model.generation_config.pad_token_id = token_id("<|endoftext|>")
    output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output, safe_serialization=True)
    patches = {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2}
    processor = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(size=IMAGE_PIXELS, **patches),
        video_processor=Qwen2VLVideoProcessor(**patches),
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(output)
    tokenizer.save_pretrained(output)


def steer(model: object, end_tokens: list[int], true_tokens: list[int]) -> None:
    """Hold residual dimension ``STEADY_DIM`` at ``STEADY_VALUE`` at every text position (every token
    embedding carries it, no attention or MLP output writes to it) and let the output head read it as
    votes for ``end_tokens`` and ``true_tokens`` only."""
    import torch

    text = model.model.language_model
    with torch.no_grad():
        text.embed_tokens.weight[:, STEADY_DIM] = STEADY_VALUE
        for layer in text.layers:
            layer.self_attn.o_proj.weight[STEADY_DIM, :] = 0.0
            layer.mlp.down_proj.weight[STEADY_DIM, :] = 0.0
        head = model.lm_head.weight
        head[:, STEADY_DIM] = 0.0
        head[end_tokens, STEADY_DIM] = END_WEIGHT
        head[true_tokens, STEADY_DIM] = TRUE_WEIGHT


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tiny_model.py OUTPUT_DIR")
    build(Path(sys.argv[1]))
