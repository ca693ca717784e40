"""Reading /proc/net/tcp{,6} and deciding who answers on a port (pure parts of deploy/listener)."""

from __future__ import annotations

import ipaddress

from hypothesis import given
from hypothesis import strategies as st

from fleetgen.deploy.listener import Listener, PortOwners, parse_address, stranger_problem


def test_addresses_are_little_endian_words() -> None:
    assert parse_address("0100007F") == ipaddress.ip_address("127.0.0.1")
    assert parse_address("00000000") == ipaddress.ip_address("0.0.0.0")
    assert parse_address("00000000000000000000000001000000") == ipaddress.ip_address("::1")
    assert parse_address("0000000000000000FFFF00000100007F") == ipaddress.ip_address("::ffff:127.0.0.1")


ADDRESSES = ["127.0.0.1", "0.0.0.0", "::", "::1", "::ffff:127.0.0.1", "10.0.0.5"]


@given(
    parents=st.dictionaries(st.integers(2, 40), st.integers(1, 40), max_size=40),
    sockets=st.lists(
        st.tuples(st.sampled_from(ADDRESSES), st.frozensets(st.integers(1, 40), max_size=3)), max_size=4
    ),
    pid=st.integers(2, 40),
    bind=st.sampled_from(["127.0.0.1", "0.0.0.0", "10.0.0.5"]),
)
def test_ours_only_when_the_family_alone_holds_every_socket_a_request_can_reach(
    parents: dict[int, int], sockets: list[tuple[str, frozenset[int]]], pid: int, bind: str
) -> None:
    listeners = tuple(Listener(i, ipaddress.ip_address(a), h) for i, (a, h) in enumerate(sockets))
    owners = PortOwners(8000, listeners, parents, {})
    family = owners.family_of(pid)
    for member in family - {pid}:  # every member descends from pid
        walk, seen = member, set()
        while walk != pid and walk in parents and walk not in seen:
            seen.add(walk)
            walk = parents[walk]
        assert walk == pid
    reachable = [lst for lst in listeners if lst.can_receive(bind)]
    ours = bool(reachable) and all(lst.holders and lst.holders <= family for lst in reachable)
    assert (stranger_problem(owners, pid, bind) == "") == ours
