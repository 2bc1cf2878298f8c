"""The throwaway PostgreSQL and Redis the harness starts on a machine where none answers on 127.0.0.1.

CI's machines and this one run both servers, so the tier normally uses them; this test forces the
other path, so a fresh machine (where ``make test`` installs Debian's postgresql and redis-server)
is known to work too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deployment.harness import Postgres, Redis, answers

pytestmark = [pytest.mark.deployment, pytest.mark.timeout(300)]


def test_throwaway_postgres_and_redis_start_serve_and_stop(tmp_path: Path) -> None:
    import psycopg2
    import redis

    postgres = Postgres.throwaway(tmp_path)
    broker = Redis.throwaway(tmp_path)
    try:
        assert postgres.create_database("olmocr_probe") is True
        assert postgres.create_database("olmocr_probe") is False
        connection = psycopg2.connect(host=postgres.host, port=postgres.port, user="postgres", dbname="olmocr_probe")
        with connection, connection.cursor() as cursor:
            cursor.execute("SELECT 41 + 1")
            assert cursor.fetchone() == (42,)
        connection.close()
        postgres.drop_database("olmocr_probe")
        client = redis.Redis.from_url(broker.url)
        client.set("probe", "1")
        assert client.get("probe") == b"1"
        client.close()
    finally:
        postgres.stop()
        broker.stop()
    assert not answers(postgres.host, postgres.port)
    assert not answers(broker.host, broker.port)
