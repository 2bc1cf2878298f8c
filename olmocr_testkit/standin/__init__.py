"""vLLM stand-in for tests and benchmarks: olmOCR's page protocol over real HTTP on 127.0.0.1."""

from olmocr_testkit.standin.server import FAULTS, StandinConfig, StandinServer, VllmStandin

__all__ = ["FAULTS", "StandinConfig", "StandinServer", "VllmStandin"]
