"""The admission window: documents that stop part-way give back every page they held."""

from __future__ import annotations

import asyncio

from olmocr_tasks.run.admission import Admission


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_document_that_stops_part_way_gives_back_its_unfinished_pages() -> None:
    async def scenario() -> tuple[bool, bool]:
        admission = Admission(high_water_pages=4, max_open_documents=5)
        other = await admission.enter()  # keeps one document open, so "none open" does not admit
        failing = await admission.enter()
        await failing.pages_known(10)
        await failing.page_done()
        await failing.page_done()
        blocked = asyncio.create_task(admission.enter())
        await _settle()
        held_while_open = not blocked.done()  # 1 + 8 pages wait: over the high-water mark
        await failing.leave()  # stopped with 8 pages unconverted (the error-rate guard, say)
        await _settle()
        admitted_after = blocked.done()
        await (await blocked).leave()
        await other.leave()
        return held_while_open, admitted_after

    held_while_open, admitted_after = asyncio.run(scenario())
    assert held_while_open
    assert admitted_after


def test_leaving_twice_counts_once_and_a_finished_document_gives_back_nothing_more() -> None:
    async def scenario() -> list[bool]:
        admission = Admission(high_water_pages=2, max_open_documents=3)
        first = await admission.enter()
        second = await admission.enter()  # 2 pages waiting: at the mark
        await second.pages_known(1)
        await second.page_done()
        await second.leave()
        await second.leave()  # a second leave must not free capacity the document never held
        waiting = asyncio.create_task(admission.enter())
        await _settle()
        observed = [waiting.done()]  # 1 page (first's) waits, 2 open < 3: admitted
        third = await waiting
        fourth_task = asyncio.create_task(admission.enter())
        await _settle()
        observed.append(fourth_task.done())  # first + third: 2 pages wait, at the mark: held
        await first.pages_known(1)
        await first.page_done()
        await _settle()
        observed.append(fourth_task.done())  # first's page done: 1 waits, admitted
        await third.leave()
        await (await fourth_task).leave()
        await first.leave()
        return observed

    assert asyncio.run(scenario()) == [True, False, True]


def test_one_document_is_always_admitted_when_none_is_open_whatever_its_size() -> None:
    async def scenario() -> bool:
        admission = Admission(high_water_pages=2, max_open_documents=1)
        big = await admission.enter()
        await big.pages_known(500)
        await big.leave()
        nxt = asyncio.create_task(admission.enter())
        await _settle()
        done = nxt.done()
        await (await nxt).leave()
        return done

    assert asyncio.run(scenario())
