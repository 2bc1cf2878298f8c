"""Loopback ports for the servers the tests start, without the race of binding port 0, closing it and
handing the number on (another process can take the port in between).

- A server of ours in this process binds port 0 itself (or is given the bound socket) and reports its
  port; nothing here is needed for that.
- A program of ours that must be told a number (a fake ``vllm`` behind the launcher) gets a
  ``reserved_port``: this process keeps the port bound, never listening, with ``SO_REUSEPORT``, and
  the program binds it with ``SO_REUSEPORT`` too. No other process can bind it meanwhile, and
  connections reach only the listening socket.
- Someone else's program (airflow api-server, redis, postgres) gets a ``free_port`` number, and the
  caller starts it again on a fresh one when its output says the address was in use
  (``address_in_use``), so a lost race costs a restart, never a failed test.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

# How many fresh ports a start is tried on before its failure is reported.
PORT_ATTEMPTS = 5


def free_port() -> int:
    """A port free now; the caller retries its start with another when it was taken meanwhile."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def address_in_use(output: str | bytes) -> bool:
    """True when a server's output says it could not bind (Python, uvicorn, Redis and PostgreSQL wording)."""
    text = output.decode(errors="replace") if isinstance(output, bytes) else output
    return "already in use" in text.lower()


@contextlib.contextmanager
def reserved_port() -> Iterator[int]:
    """A loopback port held for a server of ours that binds it with ``SO_REUSEPORT``, until the block ends."""
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", 0))
        yield holder.getsockname()[1]


@contextlib.contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback port that refuses connections until the block ends.

    Bound here and never listening: a client gets "connection refused", and no other process can start
    serving on it meanwhile (a port bound and closed could answer by the time the client connects).
    """
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        yield holder.getsockname()[1]
