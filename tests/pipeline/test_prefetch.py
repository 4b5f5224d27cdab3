"""The read-ahead thread keeps order, hands errors over where they happened and stops when closed."""

import threading
import time

import pytest

from assets.prefetch import prefetched


def test_items_arrive_in_order_and_are_produced_on_another_thread():
    producers = []

    def items():
        for i in range(50):
            producers.append(threading.current_thread().name)
            yield i

    assert list(prefetched(items(), depth=3)) == list(range(50))
    assert set(producers) == {"prefetch"}


def test_an_error_is_raised_after_the_items_before_it():
    def items():
        yield 1
        yield 2
        raise ValueError("row 3 is bad")

    seen = []
    with pytest.raises(ValueError, match="row 3 is bad"):
        for item in prefetched(items()):
            seen.append(item)
    assert seen == [1, 2]


def test_closing_early_stops_the_producer():
    produced = []

    def items():
        for i in range(1000):
            produced.append(i)
            yield i

    it = prefetched(items(), depth=1)
    assert next(it) == 0
    it.close()
    settled = len(produced)
    time.sleep(0.2)
    assert len(produced) == settled <= 3  # the one handed out, one queued, one in the producer's hand
    assert not any(t.name == "prefetch" for t in threading.enumerate())
