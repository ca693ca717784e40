"""Who answers on an instance's port: proof that the process fleetgen started holds the listening socket.

A health check only proves that SOMETHING answers on the port: another instance started on the same port,
or any process that took it between the port check and the engine's bind, answers just as well. The kernel
knows better: /proc/net/tcp{,6} list the LISTEN sockets on the port with their inodes, and /proc/PID/fd
links (`socket:[INODE]`) say which processes hold them. Every listening socket that can receive fleetgen's
requests must be held by the started process or one of its descendants (an engine may serve HTTP from a
child); any other holder is named (pid, argv) with the fix. Any engine, any Linux host, one SSH round trip.
"""

from __future__ import annotations

import base64
import ipaddress
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fleetgen.remote.base import Host
from fleetgen.remote.scripts import sh

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# $1 port. Prints `L INODE ADDR_HEX` per LISTEN socket on the port, `P PID PPID` per process, `H PID INODE`
# per holder of one of those sockets, `C PID BASE64(cmdline)` per holder. /proc/PID/stat's comm may hold
# spaces and parentheses: the state and ppid follow its LAST `) `. Holders come from one `ls -l` of every
# /proc/PID/fd (POSIX ls + awk: no GNU find needed, so busybox hosts work too).
OWNERS_SH = r"""
hex=$(printf '%04X' "$1")
listeners=$(awk -v p=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == p {
  print $10, substr($2, 1, length($2) - 5) }' /proc/net/tcp /proc/net/tcp6 2>/dev/null)
[ -n "$listeners" ] || exit 0
printf '%s\n' "$listeners" | sed 's/^/L /'
sed -n 's/^\([0-9]*\) .*) [A-Za-z] \([0-9]*\) .*/P \1 \2/p' /proc/[0-9]*/stat 2>/dev/null
want=" $(printf '%s\n' "$listeners" | cut -d' ' -f1 | tr '\n' ' ')"
holders=$(ls -l /proc/[0-9]*/fd 2>/dev/null | awk -v want="$want" '
  /^\/proc\/[0-9]+\/fd:$/ { split($0, part, "/"); pid = part[3]; next }
  $NF ~ /^socket:\[[0-9]+\]$/ {
    ino = $NF; gsub(/[^0-9]/, "", ino); if (index(want, " " ino " ")) print "H", pid, ino }' |
  sort -u)
[ -n "$holders" ] || exit 0
printf '%s\n' "$holders"
for pid in $(printf '%s\n' "$holders" | cut -d' ' -f2 | sort -u); do
  printf 'C %s %s\n' "$pid" "$(base64 -w0 "/proc/$pid/cmdline" 2>/dev/null)"
done
exit 0
"""


@dataclass(frozen=True)
class Listener:
    """One LISTEN socket on the port: its inode, local address, and the processes holding it."""

    inode: int
    address: Address
    holders: frozenset[int]

    def can_receive(self, bind: str) -> bool:
        """Whether a request to the instance's address (`bind`, or any when it binds every interface) can
        land on this socket."""
        try:
            wanted = ipaddress.ip_address(bind)
        except ValueError:  # a host name: any listener may be the one it resolves to
            return True
        if wanted.is_unspecified or self.address.is_unspecified:
            return True
        return _plain(self.address) == _plain(wanted)


@dataclass(frozen=True)
class PortOwners:
    """The LISTEN sockets on one port of a host, who holds them, the host's process tree, holders' argv."""

    port: int
    listeners: tuple[Listener, ...]
    parents: Mapping[int, int]
    argv: Mapping[int, tuple[str, ...]]

    def family_of(self, pid: int) -> set[int]:
        """`pid` and every descendant of it."""
        family = {pid}
        while born := {child for child, parent in self.parents.items() if parent in family} - family:
            family |= born
        return family

    def describe(self, listeners: Sequence[Listener], exclude: set[int]) -> str:
        """`pid 123 (python -m x …) on 0.0.0.0`, for each holder not in `exclude`, or an unseen holder."""
        parts = []
        for lst in listeners:
            others = sorted(lst.holders - exclude)
            if not others:
                parts.append(
                    f"a process fleetgen cannot see (another user's, or in a container) on {lst.address} "
                    f"(socket inode {lst.inode}; `sudo ss -ltnp 'sport = :{self.port}'` names it)"
                )
            for pid in others:
                command = shlex.join(self.argv.get(pid, ())) or "?"
                parts.append(f"pid {pid} ({command[:300]}) on {lst.address}")
        return "; ".join(parts)


def _plain(address: Address) -> Address:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def parse_address(text: str) -> Address:
    """/proc/net/tcp{,6}'s hex address: 32-bit words in host (little-endian) byte order."""
    raw = bytes.fromhex(text)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.IPv4Address(words) if len(words) == 4 else ipaddress.IPv6Address(words)


def parse_owners(port: int, stdout: str) -> PortOwners:
    """Read what OWNERS_SH printed."""
    sockets: dict[int, Address] = {}
    holders: dict[int, set[int]] = {}
    parents: dict[int, int] = {}
    argv: dict[int, tuple[str, ...]] = {}
    for line in stdout.splitlines():
        kind, _, rest = line.partition(" ")
        fields = rest.split(" ")
        if kind == "L" and len(fields) == 2 and fields[0].isdigit():
            sockets[int(fields[0])] = parse_address(fields[1])
        elif kind == "P" and len(fields) == 2 and all(f.isdigit() for f in fields):
            parents[int(fields[0])] = int(fields[1])
        elif kind == "H" and len(fields) == 2 and all(f.isdigit() for f in fields):
            holders.setdefault(int(fields[1]), set()).add(int(fields[0]))
        elif kind == "C" and fields[0].isdigit():
            raw = base64.b64decode(fields[1]) if len(fields) > 1 else b""
            argv[int(fields[0])] = tuple(a.decode(errors="replace") for a in raw.split(b"\0")[:-1])
    listeners = tuple(
        Listener(inode, address, frozenset(holders.get(inode, ()))) for inode, address in sockets.items()
    )
    return PortOwners(port, listeners, parents, argv)


def stranger_problem(owners: PortOwners, pid: int, bind: str) -> str:
    """Why requests to the port may not reach `pid` (naming who would answer instead): no socket that can
    receive them is held by `pid`'s family, or one is held by another process too; empty when they can reach
    nothing else."""
    family = owners.family_of(pid)
    reachable = [lst for lst in owners.listeners if lst.can_receive(bind)]
    if not any(lst.holders & family for lst in reachable):
        who = (
            f"it is held by {owners.describe(reachable, family)}"
            if reachable
            else "nothing listens there now"
        )
        return f"the process fleetgen started (pid {pid}) does not listen on port {owners.port}; {who}"
    if strangers := [lst for lst in reachable if not lst.holders or not lst.holders <= family]:
        return (
            f"port {owners.port} is also listened on by {owners.describe(strangers, family)}: requests may "
            f"reach it instead of pid {pid}"
        )
    return ""


async def port_owners(host: Host, port: int) -> PortOwners:
    """Who listens on `port` of `host`, read in one round trip."""
    res = await host.run(sh(OWNERS_SH, str(port)))
    return parse_owners(port, res.stdout)
