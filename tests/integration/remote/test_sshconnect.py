"""Connection failures against real sshd: each refused with one clear cause and the fix that resolves it.

Unknown and changed host keys, the insecure opt-out (works, and warns on every connect), a closed port, a
key the host does not accept, a missing identity file.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from fleetgen.errors import ConnectError, HostKeyError
from fleetgen.remote import SshHost
from tests.fixtures.ports import free_port
from tests.fixtures.sshd import SshdHost, SshKeys


async def test_unknown_host_key_is_refused_with_the_line_that_trusts_it(
    ssh_hosts: list[SshdHost], tmp_path: Path
) -> None:
    host = ssh_hosts[0]
    known = tmp_path / "known_hosts"
    known.write_text("")
    with pytest.raises(HostKeyError) as caught:
        async with SshHost(host.entry(known_hosts=str(known))):
            pass
    err = caught.value
    assert "unknown" in err.message and str(known) in err.message
    assert f"ssh-keyscan -p {host.port} -t ed25519 127.0.0.1 >> {known}" in err.fix
    assert err.context["known_hosts line"] == host.host_key_line  # the exact line to add
    assert str(err.context["offered key"]).startswith("SHA256:")

    known.write_text(str(err.context["known_hosts line"]) + "\n")  # follow the fix …
    async with SshHost(host.entry(known_hosts=str(known))) as trusted:  # … and it connects
        assert (await trusted.run(["echo", "ok"])).stdout == "ok\n"


async def test_missing_known_hosts_file_refuses_every_host(ssh_hosts: list[SshdHost], tmp_path: Path) -> None:
    with pytest.raises(HostKeyError, match="unknown"):
        async with SshHost(ssh_hosts[0].entry(known_hosts=str(tmp_path / "absent"))):
            pass


async def test_changed_host_key_is_refused_with_how_to_replace_it(
    ssh_hosts: list[SshdHost], tmp_path: Path
) -> None:
    target, other = ssh_hosts[0], ssh_hosts[1]
    known = tmp_path / "known_hosts"
    # The entry for target's port holds ANOTHER server's key: as a reinstalled or impersonated host would.
    forged = other.host_key_line.replace(f"]:{other.port} ", f"]:{target.port} ")
    known.write_text(forged + "\n")
    with pytest.raises(HostKeyError) as caught:
        async with SshHost(target.entry(known_hosts=str(known))):
            pass
    err = caught.value
    assert "CHANGED" in err.message
    assert f"ssh-keygen -R '[127.0.0.1]:{target.port}' -f {known}" in err.fix
    assert "ssh-keyscan" in err.fix


async def test_insecure_skip_connects_and_warns_on_every_connect(
    ssh_hosts: list[SshdHost], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    entry = ssh_hosts[1].entry(known_hosts=str(known), insecure_skip_host_key_check=True)
    caplog.set_level(logging.WARNING, logger="fleetgen.remote")
    for _ in range(2):
        host = SshHost(entry)
        async with host:
            assert (await host.run(["echo", "in"])).stdout == "in\n"
        assert len(host.warnings) == 1 and "host key checking is OFF" in host.warnings[0]
    assert sum("host key checking is OFF" in r.getMessage() for r in caplog.records) == 2


async def test_closed_port_is_unreachable_with_a_fix(ssh_hosts: list[SshdHost]) -> None:
    port = free_port()
    with pytest.raises(ConnectError) as caught:
        async with SshHost(ssh_hosts[0].entry(ssh=f"127.0.0.1:{port}")):
            pass
    err = caught.value
    assert "cannot reach" in err.message and "connection refused" in err.message
    assert f"sshd listens on port {port}" in err.fix and f"ssh -p {port}" in err.fix


async def test_wrong_key_is_refused_with_how_to_authorize_it(
    ssh_hosts: list[SshdHost], ssh_keys: SshKeys
) -> None:
    host = ssh_hosts[0]
    with pytest.raises(ConnectError) as caught:
        async with SshHost(host.entry(identity=str(ssh_keys.wrong_identity))):
            pass
    err = caught.value
    assert "refused the SSH key" in err.message and host.user in err.message
    assert f"ssh-copy-id -i {ssh_keys.wrong_identity}.pub -p {host.port}" in err.fix


async def test_missing_identity_file_names_it(ssh_hosts: list[SshdHost], tmp_path: Path) -> None:
    missing = tmp_path / "no_key"
    with pytest.raises(ConnectError) as caught:
        async with SshHost(ssh_hosts[0].entry(identity=str(missing))):
            pass
    assert str(missing) in caught.value.message and "ssh-keygen" in caught.value.fix
