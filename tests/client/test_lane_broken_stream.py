"""A stream that broke while its sender waited for a message must not take the next one.

The race behind an intermittent CI failure (tests/hostile/test_idle_streams.py, the
client reopening an idle-closed stream): the dead stream's request generator, waiting
in `next_to_send`, woke on the next `offer` after `requeue_unacked` had run and moved
the message into `sent`, where no stream would send it until the ack timeout. With
`live`, the lane asks, under its lock and after the wait, whether the stream is open.
"""

from __future__ import annotations

import threading

from service.client.lane import Lane


def test_a_broken_streams_waiting_sender_leaves_the_next_message_unsent() -> None:
    lane = Lane(capacity=8)
    broken = threading.Event()
    got: list[object] = []
    waiting = threading.Event()

    def dead_stream_sender() -> None:
        waiting.set()
        got.append(lane.next_to_send(5.0, live=lambda: not broken.is_set()))

    sender = threading.Thread(target=dead_stream_sender)
    sender.start()
    assert waiting.wait(5.0)
    broken.set()  # the stream ends ...
    lane.requeue_unacked()  # ... and the client requeues before the next stream opens
    assert lane.offer("request-1")  # wakes the dead stream's sender, if it still waits
    sender.join(10.0)
    assert not sender.is_alive()
    assert got == [None]
    assert lane.next_to_send(0.0, live=lambda: True) == (1, "request-1")


def test_a_live_stream_still_takes_messages_in_order() -> None:
    lane = Lane(capacity=8)
    assert lane.offer("a") and lane.offer("b")
    assert lane.next_to_send(0.0, live=lambda: True) == (1, "a")
    assert lane.next_to_send(0.0) == (2, "b")
