"""Tests of the DAG files in dags/."""
