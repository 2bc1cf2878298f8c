"""Tests of olmocr_tasks.inference."""
