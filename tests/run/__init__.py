"""Tests of olmocr_tasks.run."""
