"""Tests of the command line (olmocr_tasks.cli)."""
