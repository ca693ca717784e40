"""`remote.ray.connect_twice`: which failed `ray.init` calls are tried once more, and what is said.

The failures are Ray's own, in the shapes its client raises them (ray/util/client/worker.py,
server/proxier.py): the proxy's refusal arrives as `ConnectionAbortedError("Initialization failure from
server:\\n" + the head's traceback)`, the client's own timeout as `ConnectionError("ray client connection
timeout")`. A loaded head that cannot start a connection's own server is not something a unit test can make
happen on demand (it took the CI's whole suite), so `attempt` stands for `ray.init` here, raising them; the
address probe is real (a socket that listens, a port where nothing does). The real connection runs in
tests/integration/deploy/test_ray_fleet.py."""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import AsyncIterator, Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetgen.errors import RemoteError
from fleetgen.remote.ray import connect_twice, is_retried
from tests.fixtures.ports import free_ports


def proxy_refusal(words: str) -> ConnectionAbortedError:
    """The proxy's `RuntimeError(words)`, formatted on the head and raised by the client as Ray does."""
    try:
        raise RuntimeError(words)
    except RuntimeError:
        head_traceback = traceback.format_exc()
    return ConnectionAbortedError(f"Initialization failure from server:\n{head_traceback}")


SERVER_FAILED = "Starting Ray client server failed. See ray_client_server_23001.err for detailed logs."
NO_BACKEND = (
    "Proxy failed to Connect to backend! Check `ray_client_server.err` and `ray_client_server_23000.err` on "
    "the head node of the cluster for the relevant logs. By default these are located at "
    "/tmp/ray/session_latest/logs."
)
TIMEOUT = ConnectionError("ray client connection timeout")
# Ray's refusals that another try cannot change
FINAL = [
    RuntimeError("Version mismatch: The cluster was started with:\n    Ray: 2.59.0\n    Python: 3.11.9\n"),
    ValueError("Invalid address format: ray://head:port:1"),
    ConnectionError("Could not find any running Ray instance. Please specify the one to connect to."),
    proxy_refusal("Failed to create runtime_env for Ray client server, it is caused by:\nno such pip pkg"),
]

hosts = st.sampled_from(["127.0.0.1", "head", "ray-head.kuberay.svc.cluster.local", "10.0.0.7"])
ports = st.integers(1, 65535).map(str)


@given(hosts, ports, st.sampled_from([SERVER_FAILED, NO_BACKEND]), st.booleans())
def test_a_ray_client_connection_whose_own_server_did_not_start_is_retried(
    host: str, port: str, words: str, is_listening: bool
) -> None:
    assert is_retried(f"ray://{host}:{port}", proxy_refusal(words), is_listening=is_listening)


@given(hosts, ports, st.booleans())
def test_the_clients_timeout_is_retried_only_where_something_listens(
    host: str, port: str, is_listening: bool
) -> None:
    assert is_retried(f"ray://{host}:{port}", TIMEOUT, is_listening=is_listening) is is_listening


@given(hosts, ports, st.sampled_from([*FINAL, TIMEOUT, proxy_refusal(SERVER_FAILED)]), st.booleans())
def test_a_gcs_address_and_rays_final_refusals_are_never_retried(
    host: str, port: str, exc: Exception, is_listening: bool
) -> None:
    assert not is_retried(f"{host}:{port}", exc, is_listening=is_listening)  # the GCS: no Ray Client
    if exc in FINAL:
        assert not is_retried(f"ray://{host}:{port}", exc, is_listening=is_listening)


class Attempts:
    """`ray.init` standing in: raises `failures` in turn, then connects; counts its calls."""

    def __init__(self, *failures: Exception) -> None:
        self.failures, self.calls = list(failures), 0

    async def __call__(self) -> None:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)


def said_lines() -> tuple[list[str], Callable[[str], None]]:
    lines: list[str] = []
    return lines, lines.append


@pytest.fixture
async def listening() -> AsyncIterator[str]:
    """A `ray://` address where a socket listens (and says nothing, as a head too loaded to answer)."""
    server = await asyncio.start_server(lambda _r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"ray://127.0.0.1:{port}"


@pytest.mark.parametrize("words", [SERVER_FAILED, NO_BACKEND])
async def test_a_second_try_that_connects_is_said_and_nothing_raised(words: str) -> None:
    attempts, (lines, say) = Attempts(proxy_refusal(words)), said_lines()
    await connect_twice(attempts, "ray://head:10001", say)
    assert attempts.calls == 2
    [line] = lines
    assert "ray://head:10001" in line and words.split("!")[0].split(".")[0] in line and "once more" in line


async def test_two_refusals_raise_rays_words_and_the_fix_for_a_loaded_head(listening: str) -> None:
    attempts, (lines, say) = Attempts(TIMEOUT, proxy_refusal(SERVER_FAILED)), said_lines()
    with pytest.raises(RemoteError) as raised:
        await connect_twice(attempts, listening, say)
    assert attempts.calls == 2 and len(lines) == 1
    assert SERVER_FAILED in raised.value.message and "Traceback" not in raised.value.message
    fix = raised.value.fix
    assert "RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S" in fix and "`ray status`" in fix and "head" in fix


@pytest.mark.parametrize(
    "address", ["closed", "ray://no-such-head.invalid:10001", "ray://no-such-head.invalid"]
)
async def test_a_wrong_address_is_tried_once_and_says_how_to_reach_the_cluster(address: str) -> None:
    """Nothing listens there (a closed port; a name that does not resolve): Ray's timeout is not retried."""
    if address == "closed":
        address = f"ray://127.0.0.1:{free_ports(1)[0]}"
    attempts, (lines, say) = Attempts(TIMEOUT, TIMEOUT), said_lines()
    with pytest.raises(RemoteError) as raised:
        await connect_twice(attempts, address, say)
    assert attempts.calls == 1 and lines == []
    assert address in raised.value.message and "ray client connection timeout" in raised.value.message
    assert "cluster.address" in raised.value.fix


async def test_the_clients_timeout_where_a_head_listens_is_tried_once_more(listening: str) -> None:
    attempts, (lines, say) = Attempts(TIMEOUT), said_lines()
    await connect_twice(attempts, listening, say)
    assert attempts.calls == 2 and len(lines) == 1


@pytest.mark.parametrize("exc", FINAL)
async def test_rays_final_refusals_are_raised_at_once(exc: Exception) -> None:
    attempts, (lines, say) = Attempts(exc), said_lines()
    with pytest.raises(RemoteError) as raised:
        await connect_twice(attempts, "ray://head:10001", say)
    assert attempts.calls == 1 and lines == []
    assert raised.value.__cause__ is exc
