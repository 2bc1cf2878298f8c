"""Tests of olmocr_tasks.location."""
