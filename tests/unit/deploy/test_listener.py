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
# Which listening addresses a request to the instance's bind address can land on, written out: a wildcard
# socket takes any, a wildcard bind may be reached on any; an IPv4-mapped IPv6 address is its IPv4 one.
REACHES = {
    "127.0.0.1": {"127.0.0.1", "0.0.0.0", "::", "::ffff:127.0.0.1"},
    "10.0.0.5": {"10.0.0.5", "0.0.0.0", "::"},
    "0.0.0.0": set(ADDRESSES),
}


def descends(member: int, pid: int, parents: dict[int, int]) -> bool:
    """Walk `member`'s ancestors (a cycle or an unknown parent ends the walk): is `pid` among them?"""
    seen = set()
    while member != pid and member in parents and member not in seen:
        seen.add(member)
        member = parents[member]
    return member == pid


def test_a_grandchild_holding_the_socket_is_the_started_process() -> None:
    """An engine's launcher forks a server that forks the HTTP worker: the socket's holder is a grandchild
    of the started pid (100 → 101 → 102). A sibling's socket (200, also init's child) is a stranger."""
    parents = {100: 1, 101: 100, 102: 101, 200: 1}
    grandchild = PortOwners(
        8000, (Listener(7, ipaddress.ip_address("0.0.0.0"), frozenset({102})),), parents, {}
    )
    assert stranger_problem(grandchild, 100, "0.0.0.0") == ""
    sibling = PortOwners(8000, (Listener(7, ipaddress.ip_address("0.0.0.0"), frozenset({200})),), parents, {})
    assert "held by pid 200 (" in stranger_problem(sibling, 100, "0.0.0.0")


# A process tree as /proc has it (each parent started before its child: a smaller pid), deep (a parent at
# most 3 pids back: grandchildren everywhere), or any mapping at all (a torn read of /proc may show anything).
TREES = st.lists(st.integers(1, 3), min_size=39, max_size=39).map(
    lambda steps: {child: max(child - step, 1) for child, step in zip(range(2, 41), steps, strict=True)}
)


@given(
    data=st.data(),
    parents=TREES | st.dictionaries(st.integers(2, 40), st.integers(1, 40), max_size=40),
    pid=st.integers(2, 40),
    bind=st.sampled_from(sorted(REACHES)),
)
def test_ours_only_when_the_family_alone_holds_every_socket_a_request_can_reach(
    data: st.DataObject, parents: dict[int, int], pid: int, bind: str
) -> None:
    """The expectation is built apart from the code under test: the family by walking each holder's
    ancestors, the reachable sockets from the table above."""
    family = [p for p in range(1, 41) if descends(p, pid, parents)]
    # Half the examples draw holders from the family only (else a stranger is almost always among them).
    holder = st.sampled_from(family) if data.draw(st.booleans()) else st.integers(1, 40)
    sockets = data.draw(
        st.lists(st.tuples(st.sampled_from(ADDRESSES), st.frozensets(holder, max_size=3)), max_size=4)
    )
    listeners = tuple(Listener(i, ipaddress.ip_address(a), h) for i, (a, h) in enumerate(sockets))
    owners = PortOwners(8000, listeners, parents, {})
    reachable = [holders for address, holders in sockets if address in REACHES[bind]]
    ours = bool(reachable) and all(
        holders and all(descends(h, pid, parents) for h in holders) for holders in reachable
    )
    assert (stranger_problem(owners, pid, bind) == "") == ours
