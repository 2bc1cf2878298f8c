"""The contract under ``--scheduling-policy priority``, on the real vLLM and the stand-in alike.

A file of its own, run after the fcfs tests, so the tier restarts the real server once for it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.vllm.conftest import STANDIN_HOLD_S, ContractServer, contract_server, wait_for
from tests.vllm.test_contract import LONG_TOKENS, abandoned_request, page_request, post, queue

# Each queued request generates for about a second (and holds the stand-in a moment), so one finishing
# is over before the next starts and finishing order is serving order: with 40 tokens vLLM's answers
# reached the client together, in any order.
QUEUED_TOKENS = 200


@pytest.fixture(params=["vllm", "standin"])
def priority_server(request: pytest.FixtureRequest) -> Iterator[ContractServer]:
    servers = request.getfixturevalue("vllm_servers") if request.param == "vllm" else None
    with contract_server(request.param, "priority", servers) as contract:
        yield contract


def test_priority_scheduling_serves_the_waiting_queue_lowest_first(priority_server: ContractServer) -> None:
    finished: list[int] = []
    lock = threading.Lock()

    def send(priority: int, **fields: Any) -> None:
        response = post(priority_server, page_request(priority=priority, **fields), timeout=300)
        assert response.status_code == 200, response.text
        with lock:
            finished.append(priority)

    blocker = page_request(priority=0, max_tokens=LONG_TOKENS, min_tokens=LONG_TOKENS)
    standin = priority_server.standin
    if standin is not None:
        standin.configure(latency_s=STANDIN_HOLD_S)
    try:
        with ThreadPoolExecutor(3) as pool:
            # One running request (one sequence at a time) holds the server while three queue behind it
            # in arrival order; its client then goes away, which frees the server for the queue.
            with abandoned_request(priority_server, blocker):
                wait_for(lambda: queue(priority_server).running == 1)
                if standin is not None:
                    # Each queued request takes a moment there too: finishing order is serving order.
                    standin.configure(latency_s=0.3)
                queued = []
                for count, priority in enumerate((10, -3, 5), start=1):
                    queued.append(pool.submit(send, priority, max_tokens=QUEUED_TOKENS, min_tokens=QUEUED_TOKENS))
                    # A request is waiting only once the API server has prepared its page image, which
                    # can take long on a loaded 2-core machine (60 s was once too short in make test).
                    wait_for(lambda count=count: queue(priority_server).waiting >= count, timeout_s=240)
            for future in queued:
                future.result()
    finally:
        if standin is not None:
            standin.configure(latency_s=0.0)
    assert finished == [-3, 5, 10]
