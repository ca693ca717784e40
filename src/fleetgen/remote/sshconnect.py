"""Open one asyncssh connection for a HostEntry, and translate why it failed into cause + fix.

Host keys are checked by default against the host's `known_hosts` file (else ~/.ssh/known_hosts). Only
`insecure_skip_host_key_check = true` turns that off, and then every connect adds a warning.
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import os
import socket
from pathlib import Path
from typing import Any

from fleetgen.config import HostEntry
from fleetgen.errors import ConnectError, HostKeyError
from fleetgen.remote.sshlib import asyncssh

log = logging.getLogger("fleetgen.remote")

CONNECT_TIMEOUT_S = 15.0
# Keepalives: without them a silently dead peer (host rebooted, NAT dropped the flow) leaves every call
# waiting on a TCP connection that will never answer. 3 missed replies 10 s apart → the connection is
# declared lost, in-flight calls fail with ConnectionLost, and the next call reconnects.
KEEPALIVE_INTERVAL_S = 10.0
KEEPALIVE_COUNT_MAX = 3


def username(entry: HostEntry) -> str:
    return entry.user or getpass.getuser()


def known_hosts_path(entry: HostEntry) -> Path:
    return Path(os.path.expanduser(entry.known_hosts or "~/.ssh/known_hosts"))


def _known_hosts_arg(entry: HostEntry, warnings: list[str]) -> Any:
    if entry.insecure_skip_host_key_check:
        message = (
            f"host key checking is OFF for {entry.name} ({entry.address}:{entry.port}): anyone on the path "
            f"can impersonate it; remove insecure_skip_host_key_check from [[hosts]] {entry.name}"
        )
        warnings.append(message)
        log.warning(message)
        return None  # asyncssh: None disables host key validation
    path = known_hosts_path(entry)
    # A missing file means "no host is known": every host is refused, with the fix to trust it.
    return str(path) if path.exists() else asyncssh.import_known_hosts("")


def _client_keys(entry: HostEntry) -> Any:
    if entry.identity is None:
        return ()  # asyncssh default: ~/.ssh/id_* and the agent
    path = Path(os.path.expanduser(entry.identity))
    if not path.exists():
        fix = f"fix `identity` in [[hosts]] {entry.name}, or create a key: ssh-keygen -t ed25519 -f {path}"
        raise connect_error(entry, f"identity file {path} of host {entry.name} does not exist", fix)
    return [str(path)]


async def connect(entry: HostEntry, warnings: list[str]) -> asyncssh.SSHClientConnection:
    """One SSH connection to `entry`, or ConnectError / HostKeyError saying why not and what to do."""
    known = _known_hosts_arg(entry, warnings)
    try:
        return await asyncssh.connect(
            entry.address,
            port=entry.port,
            username=username(entry),
            known_hosts=known,
            client_keys=_client_keys(entry),
            connect_timeout=CONNECT_TIMEOUT_S,
            keepalive_interval=KEEPALIVE_INTERVAL_S,
            keepalive_count_max=KEEPALIVE_COUNT_MAX,
        )
    except asyncssh.HostKeyNotVerifiable as exc:
        raise await host_key_error(entry) from exc
    except asyncssh.PermissionDenied as exc:
        raise auth_error(entry) from exc
    except (asyncssh.KeyImportError, asyncssh.KeyEncryptionError) as exc:
        fix = "use an unencrypted key file, or load the key into ssh-agent and drop `identity`"
        raise connect_error(
            entry, f"cannot load the identity {entry.identity} for {entry.name}: {exc}", fix
        ) from exc
    except (TimeoutError, OSError, asyncssh.Error) as exc:
        raise unreachable_error(entry, exc) from exc


def where(entry: HostEntry) -> str:
    return f"{username(entry)}@{entry.address}:{entry.port}"


def connect_error(entry: HostEntry, message: str, fix: str) -> ConnectError:
    """Why fleetgen cannot use its connection to `entry`, and where it tried to connect."""
    return ConnectError(message, fix=fix, context={"host": entry.name, "ssh": where(entry)})


def unreachable_error(entry: HostEntry, exc: BaseException) -> ConnectError:
    """ConnectError for a host that could not be reached (refused, timed out, unknown name, dropped)."""
    if isinstance(exc, ConnectionRefusedError):
        cause = "connection refused (nothing listens on that port)"
    elif isinstance(exc, asyncio.TimeoutError):
        cause = f"no answer within {CONNECT_TIMEOUT_S:g}s"
    elif isinstance(exc, socket.gaierror):
        cause = f"cannot resolve the name {entry.address!r}"
    elif isinstance(exc, asyncssh.Error):
        cause = f"SSH handshake failed: {exc.reason}"
    else:
        cause = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    fix = (
        f"check that {entry.name} is up and sshd listens on port {entry.port} "
        f"(try: ssh -p {entry.port} {username(entry)}@{entry.address} true), "
        f"or fix `ssh` in [[hosts]] {entry.name}"
    )
    return connect_error(
        entry, f"cannot reach host {entry.name} at {entry.address}:{entry.port}: {cause}", fix
    )


def auth_error(entry: HostEntry) -> ConnectError:
    key = entry.identity or "your default keys (~/.ssh/id_*, ssh-agent)"
    pub = f"{entry.identity}.pub" if entry.identity else "~/.ssh/id_ed25519.pub"
    user = username(entry)
    fix = (
        f"authorize the key on the host: ssh-copy-id -i {pub} -p {entry.port} {user}@{entry.address} "
        f"(or append {pub} to ~{user}/.ssh/authorized_keys there), "
        f"or set `identity` in [[hosts]] {entry.name}"
    )
    return connect_error(entry, f"host {entry.name} refused the SSH key for user {user} ({key})", fix)


async def host_key_error(entry: HostEntry) -> HostKeyError:
    """HostKeyError for an unknown or changed key, with the exact command (and line) that trusts it."""
    path = known_hosts_path(entry)
    pattern = entry.address if entry.port == 22 else f"[{entry.address}]:{entry.port}"
    offered = await _offered_key(entry)
    context: dict[str, object] = {"host": entry.name, "ssh": where(entry), "known_hosts": str(path)}
    # ssh-keyscan's `-t` for the key type the host offered us (none when unknown: scan them all)
    type_flag = ""
    if offered is not None:
        algorithm = offered.get_algorithm()
        context["offered key"] = f"{offered.get_fingerprint()} ({algorithm})"
        key_type, key_b64 = offered.export_public_key().decode().split()[:2]
        context["known_hosts line"] = f"{pattern} {key_type} {key_b64}"
        type_flag = next((f"-t {kind} " for kind in ("ed25519", "ecdsa", "rsa") if kind in algorithm), "")
    keyscan = f"ssh-keyscan -p {entry.port} {type_flag}{entry.address} >> {path}"
    if _is_listed(path, entry):
        return HostKeyError(
            f"the host key of {entry.name} ({pattern}) CHANGED: {path} lists another key; fleetgen refuses "
            "to connect (a reinstalled host, or someone in between)",
            fix=f"confirm the new fingerprint with the host's owner, then replace the entry: ssh-keygen -R "
            f"'{pattern}' -f {path} && {keyscan}",
            context=context,
        )
    return HostKeyError(
        f"the host key of {entry.name} ({pattern}) is unknown: it is not in {path}; fleetgen refuses unknown "
        "hosts",
        fix=f"confirm the fingerprint with the host's owner, then trust it: {keyscan}"
        + (" (or append the known_hosts line shown above)" if offered is not None else ""),
        context=context,
    )


async def _offered_key(entry: HostEntry) -> asyncssh.SSHKey | None:
    try:
        return await asyncio.wait_for(
            asyncssh.get_server_host_key(entry.address, entry.port), CONNECT_TIMEOUT_S
        )
    except (TimeoutError, OSError, asyncssh.Error):
        return None  # the fix line still works without the fingerprint


def _is_listed(path: Path, entry: HostEntry) -> bool:
    try:  # a missing file (OSError) lists nothing
        host_keys = asyncssh.read_known_hosts(str(path)).match(entry.address, entry.address, entry.port)[0]
    except (OSError, ValueError):
        return False
    return bool(host_keys)
