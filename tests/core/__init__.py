"""Tests of olmocr_tasks.core."""
