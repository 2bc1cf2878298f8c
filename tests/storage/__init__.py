"""Tests of olmocr_tasks.storage.store."""
