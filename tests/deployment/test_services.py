"""The throwaway PostgreSQL and Redis ``olmocr_testkit.cluster`` starts where none answers on 127.0.0.1.

CI's machines and this one run both servers, so the tier normally uses them; this test forces the
other path, so a fresh machine (where ``make test`` installs Debian's postgresql and redis-server)
is known to work too.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from olmocr_testkit import cluster, ports
from olmocr_testkit.cluster import Postgres, Redis, answers

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


def test_a_throwaway_server_whose_port_was_taken_starts_again_on_a_fresh_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL and Redis are told a port by number; another process may take it before they bind it."""
    import redis

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        offered: list[int] = []

        def taken_first() -> int:
            offered.append(taken.getsockname()[1] if len(offered) % 2 == 0 else ports.free_port())
            return offered[-1]

        monkeypatch.setattr(cluster, "free_port", taken_first)
        postgres = Postgres.throwaway(tmp_path)
        broker = Redis.throwaway(tmp_path)
        try:
            assert postgres.port == offered[1] and broker.port == offered[3], offered
            assert offered[0] == offered[2] == taken.getsockname()[1]
            assert postgres.create_database("olmocr_probe") is True
            client = redis.Redis.from_url(broker.url)
            assert client.ping() is True
            client.close()
        finally:
            postgres.stop()
            broker.stop()
    assert (tmp_path / "redis-1.log").exists() and ports.address_in_use((tmp_path / "redis-1.log").read_bytes())
