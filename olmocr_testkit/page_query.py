"""olmOCR's page request written out as a dict, for requests built by hand (tests, ``bench/floor.py``).

The product sends ``olmocr_tasks.page.protocol.RequestBodyBuilder``'s bytes, which splice the image into
JSON serialised once; ``tests/page/test_protocol.py`` checks them against ``json.dumps`` of this dict.
"""

from __future__ import annotations

from olmocr_tasks.page.protocol import PROMPT_V4


def build_page_query(model: str, image_png_base64: str, temperature: float, max_tokens: int = 8000) -> dict:
    """olmOCR's page request as a dict; ``json.dumps`` of it is what ``RequestBodyBuilder`` builds."""
    return {
        "model": model,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": PROMPT_V4},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image_png_base64}"}},
                ],
            }
        ],
        "max_tokens": max_tokens,
        "temperature": temperature,
    }
