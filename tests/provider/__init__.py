"""Tests of the Airflow side (olmocr_tasks.provider), through real Airflow runs."""
