"""Tests of olmocr_tasks.servers."""
