"""Shared fixtures. Each fixtures module owns one real component the tests start themselves."""

pytest_plugins = [
    "tests.fixtures.pdfs",
    "tests.fixtures.standin",
    "tests.fixtures.s3",
    "tests.fixtures.airflow",
]
