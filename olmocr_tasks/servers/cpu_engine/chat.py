"""The CPU engine's side of the chat-completions protocol: validate an olmOCR page request, answer it.

Requests are checked as strictly as vLLM would (model name, one inline image, token budget) and
answered in olmOCR's format: front matter (``protocol.format_front_matter``) then the page text.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import re
import time
import uuid
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from PIL import Image

from olmocr_tasks.page.protocol import format_front_matter
from olmocr_tasks.servers.cpu_engine.tesseract import PageOcr, primary_language


class RequestError(Exception):
    """A client error answered with an OpenAI-shaped JSON error body."""

    def __init__(
        self, status: HTTPStatus, message: str, error_type: str = "BadRequestError", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.param = param


def format_answer(page: PageOcr, lang: str) -> str:
    """olmOCR's answer: YAML front matter with the five keys in training order, then the text."""
    front = format_front_matter(
        primary_language=primary_language(page.text, lang),
        is_rotation_valid=page.rotation_correction == 0,
        rotation_correction=page.rotation_correction,
    )
    return front + page.text


def estimate_prompt_tokens(prompt_text: str, width: int, height: int) -> int:
    """Roughly what Qwen2.5-VL would count: 28x28-pixel patches for the image plus ~4 chars a token."""
    image_tokens = max(1, round(width / 28)) * max(1, round(height / 28))
    return image_tokens + math.ceil(len(prompt_text) / 4) + 20


@dataclass(frozen=True)
class PageRequest:
    model: str
    prompt_text: str
    image: Image.Image
    image_png: bytes
    max_tokens: int | None


def parse_chat_request(payload: Any, served_model_name: str) -> PageRequest:
    """Validate an olmOCR-shaped chat completion request; raises ``RequestError`` with 400/404."""
    if not isinstance(payload, dict):
        raise RequestError(HTTPStatus.BAD_REQUEST, "request body must be a JSON object")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError(HTTPStatus.BAD_REQUEST, "'model' must be a non-empty string", param="model")
    if model != served_model_name:
        raise RequestError(HTTPStatus.NOT_FOUND, f"The model `{model}` does not exist.", "NotFoundError", param="model")
    if payload.get("stream"):
        raise RequestError(HTTPStatus.BAD_REQUEST, "streaming is not supported by the CPU engine", param="stream")
    n = payload.get("n", 1)
    if n not in (None, 1):
        raise RequestError(HTTPStatus.BAD_REQUEST, "only n=1 is supported", param="n")
    max_tokens = payload.get("max_tokens", payload.get("max_completion_tokens"))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise RequestError(HTTPStatus.BAD_REQUEST, "'max_tokens' must be a positive integer", param="max_tokens")
    temperature = payload.get("temperature", 0.0)
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, int | float)):
        raise RequestError(HTTPStatus.BAD_REQUEST, "'temperature' must be a number", param="temperature")

    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(HTTPStatus.BAD_REQUEST, "'messages' must be a non-empty list", param="messages")
    texts: list[str] = []
    image_urls: list[str] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(HTTPStatus.BAD_REQUEST, "each message needs a 'role'", param="messages")
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
            continue
        if not isinstance(content, list):
            raise RequestError(HTTPStatus.BAD_REQUEST, "message content must be a string or a list of parts")
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind == "image_url":
                image_url = part.get("image_url")
                url = image_url.get("url") if isinstance(image_url, dict) else image_url
                if not isinstance(url, str):
                    raise RequestError(HTTPStatus.BAD_REQUEST, "image_url part without a url")
                image_urls.append(url)
            else:
                raise RequestError(HTTPStatus.BAD_REQUEST, f"unsupported content part type {kind!r}")
    if len(image_urls) != 1:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"exactly one image per request is supported, got {len(image_urls)}")
    image, image_png = _decode_image_url(image_urls[0])
    return PageRequest(
        model=model, prompt_text="\n".join(texts), image=image, image_png=image_png, max_tokens=max_tokens
    )


def _decode_image_url(url: str) -> tuple[Image.Image, bytes]:
    # Only inline data URLs: fetching remote URLs would turn the engine into an SSRF proxy.
    match = re.match(r"data:image/[A-Za-z0-9.+-]+;base64,", url)
    if match is None:
        raise RequestError(HTTPStatus.BAD_REQUEST, "image_url must be a data:image/...;base64, URL")
    try:
        data = base64.b64decode(url[match.end() :], validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(HTTPStatus.BAD_REQUEST, "image data is not valid base64") from None
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except Image.DecompressionBombError:
        raise RequestError(HTTPStatus.BAD_REQUEST, "image is too large") from None
    except Exception:
        raise RequestError(HTTPStatus.BAD_REQUEST, "image could not be decoded") from None
    if image.format != "PNG":
        # Tesseract reads PNG from stdin reliably; re-encode anything else once.
        buffer = io.BytesIO()
        image.convert("RGB").save(buffer, format="PNG", compress_level=1)
        data = buffer.getvalue()
    return image, data


def completion_body(request: PageRequest, page: PageOcr, lang: str) -> dict[str, Any]:
    """The chat completion for ``page``, cut at ``max_tokens`` with ``finish_reason="length"`` as vLLM does."""
    content = format_answer(page, lang)
    finish_reason = "stop"
    completion_tokens = max(1, math.ceil(len(content) / 4))
    if request.max_tokens is not None and completion_tokens > request.max_tokens:
        content = content[: request.max_tokens * 4]
        completion_tokens = request.max_tokens
        finish_reason = "length"
    prompt_tokens = estimate_prompt_tokens(request.prompt_text, page.width, page.height)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
