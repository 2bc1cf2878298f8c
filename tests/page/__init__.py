"""Tests of olmocr_tasks.page."""
