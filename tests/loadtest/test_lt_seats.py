"""A closed-loop phase sends from at most its level of users per process (loadtest.traffic.state.Seats),
while Locust stops the users above it at the spawn rate."""

from __future__ import annotations

from loadtest.traffic.state import Seats


def test_users_above_the_level_wait_and_a_stopped_user_gives_its_seat_back() -> None:
    seats = Seats()
    assert [seats.take(user, 7, 1) for user in range(256)] == [True] + [False] * 255  # a drain of one user
    assert seats.take(0, 7, 1)  # the seated user keeps its seat for the phase
    seats.leave(0)  # Locust stopped it: another takes over
    assert seats.take(5, 7, 1) and not seats.take(6, 7, 1)
    assert [seats.take(user, 8, 3) for user in (6, 7, 8, 9)] == [True, True, True, False]  # a new phase
    assert not any(seats.take(user, 9, 0) for user in range(3))  # a cooldown: nobody sends
