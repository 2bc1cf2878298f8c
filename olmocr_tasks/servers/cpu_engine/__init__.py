"""A local CPU OCR engine that speaks vLLM's OpenAI chat-completions protocol, backed by Tesseract.

``olmocr-tasks serve-cpu`` answers olmOCR page requests with olmOCR's front-matter format so the
DAGs, the CLI and the HTTP client cannot tell it from a vLLM server: only the connection changes.
It answers to its own model name, ``olmocr-cpu-tesseract`` (``CPU_ENGINE_MODEL``), so its outputs
are recorded under it and never taken for olmOCR's. It exists for the demo and for development
without a GPU; its text is plain Tesseract output, clearly below olmOCR's quality (no tables,
equations or reading-order model).

It uses only the standard library plus Pillow, so the core package gains no heavy dependency:
``tesseract`` runs the OCR, ``chat`` validates requests and composes answers, ``server`` is the
HTTP server.
"""

from olmocr_tasks.servers.cpu_engine.server import (
    CPU_ENGINE_MODEL,
    DEFAULT_PORT,
    CpuEngineConfig,
    CpuEngineHandle,
    create_cpu_engine,
    is_loopback_host,
    start_cpu_engine_in_thread,
)
from olmocr_tasks.servers.cpu_engine.tesseract import DEFAULT_OSD_MIN_CONFIDENCE, TesseractNotFoundError

__all__ = [
    "CPU_ENGINE_MODEL",
    "DEFAULT_OSD_MIN_CONFIDENCE",
    "DEFAULT_PORT",
    "CpuEngineConfig",
    "CpuEngineHandle",
    "TesseractNotFoundError",
    "create_cpu_engine",
    "is_loopback_host",
    "start_cpu_engine_in_thread",
]
