"""Tests of the OCR runs page (plugins/olmocr_runs)."""
