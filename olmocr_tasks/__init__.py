"""olmocr_tasks: the Airflow-free engine of olmocr-airflow.

Discover PDFs, render pages with pypdfium2, send them to an OpenAI-compatible vLLM server with
olmOCR's page protocol, and write Dolma JSONL, markdown and a run manifest.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("olmocr-airflow")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+source"

__all__ = ["__version__"]
