"""One exception tree for fleetgen. Every error says what happened, why, and what to do.

```
FleetgenError                 message + fix + context (host, argv, exit code, stderr tail, url, file, line…)
├── ConfigError               a file the user wrote is wrong (file, line, field)
├── ModelCardError            a model's config.json lacks what planning needs
├── PlanError                 a flag rule fails or the plan does not fit
├── RemoteError               anything that crossed SSH or touched a host
│   ├── ConnectError          unreachable host, refused auth
│   ├── HostKeyError          unknown or changed host key
│   ├── CommandError          a remote command exited non-zero
│   ├── TransferError         a verified put did not verify
│   └── ConnectionLost        the connection dropped while an operation was in flight
├── DeployError               an instance did not come up as intended
│   ├── LaunchFailed          the engine died or logged a fatal signature while starting
│   ├── ReadyTimeout          it did not become healthy in time
│   ├── EngineDied            it died after it was ready (tune's load, a job): its log's last error, the fix
│   └── VerifyError           it runs, but not what was asked (drift, spec decoding off, …)
├── EndpointError             an engine's HTTP endpoint answered badly or not at all
└── JobError                  a generation job cannot go on
    ├── InputError            an input file cannot be read at all
    ├── InputMismatch         an output folder run with another input (or a stored id with other content)
    ├── ParamsMismatch        resuming with other sampling params
    ├── RequestRejected       the servers refuse every request the same way: the job's request is wrong
    ├── LedgerConflict        a write for a stored (id, sample) with another prompt (never a replace)
    └── FleetDown             too many consecutive failures fleet-wide
```

Third-party exceptions are translated once, at the boundary that called the library (`raise … from exc`).
Only the CLI prints these; it renders `message`, the context lines, then `fix`.
"""

from __future__ import annotations

from collections.abc import Mapping


class FleetgenError(Exception):
    """Base of every error fleetgen raises on purpose.

    `message` says what happened and why; `fix` says what to do; `context` carries the facts a user needs
    to act (host, argv, exit code, stderr tail, URL, file, line), rendered by the CLI one per line.
    """

    exit_code = 1

    def __init__(self, message: str, *, fix: str = "", context: Mapping[str, object] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.context: dict[str, object] = dict(context or {})

    def __init_subclass__(cls, exit_code: int | None = None) -> None:
        """`class X(FleetgenError, exit_code=2)`: 2 says the user's input is wrong, 1 anything else."""
        super().__init_subclass__()
        if exit_code is not None:
            cls.exit_code = exit_code

    def __str__(self) -> str:
        parts = [self.message]
        parts += [f"  {key}: {value}" for key, value in self.context.items() if value not in (None, "")]
        if self.fix:
            parts.append(f"  fix: {self.fix}")
        return "\n".join(parts)


class ConfigError(FleetgenError, exit_code=2):
    """A file the user wrote (fleet file, job file) is invalid."""


class ModelCardError(FleetgenError, exit_code=2):
    """A model folder's config.json is missing or lacks the fields planning needs."""


class PlanError(FleetgenError, exit_code=2):
    """The plan refuses: a flag rule fails or an instance does not fit."""


class RemoteError(FleetgenError):
    """Something went wrong on or on the way to a host."""


class ConnectError(RemoteError):
    """The host could not be reached or refused authentication."""


class HostKeyError(RemoteError):
    """The host's key is unknown or changed; fleetgen refuses to talk to it."""


class CommandError(RemoteError):
    """A remote command exited non-zero."""


class TransferError(RemoteError):
    """A verified file transfer did not verify."""


class ConnectionLost(RemoteError):
    """The SSH connection dropped while an operation was in flight."""


class DeployError(FleetgenError):
    """An instance did not come up as intended."""


class LaunchFailed(DeployError):
    """The engine died, or logged a fatal signature, while starting."""


class EngineDied(DeployError):
    """The engine died after it was ready (under tune's load, in a job): its log's last error and the fix."""


class ReadyTimeout(DeployError):
    """The engine did not become healthy within the timeout."""


class VerifyError(DeployError):
    """The engine runs but not as asked (drift, speculative decoding off, capacity)."""


class EndpointError(FleetgenError):
    """An engine endpoint answered with an error or not at all."""


class JobError(FleetgenError):
    """A generation job cannot go on."""


class InputError(JobError, exit_code=2):
    """An input file cannot be read at all (a bad record becomes an error row instead)."""


class InputMismatch(JobError, exit_code=2):
    """The output folder holds another input's results, or a record's id is stored with other content."""


class ParamsMismatch(JobError, exit_code=2):
    """The output folder was made with other sampling parameters."""


class RequestRejected(JobError, exit_code=2):
    """Every request is refused the same way (HTTP 4xx): a sampling parameter or the prompts, not a server."""


class LedgerConflict(JobError):
    """A write for a stored (id, sample) with another prompt: the stored answer is final, never replaced."""


class FleetDown(JobError):
    """Too many consecutive failures across the fleet: the servers are gone."""


def tail(text: str, num_lines: int) -> str:
    """The last `num_lines` lines of `text`, for error context (stderr tails, log tails)."""
    return "\n".join(text.rstrip("\n").splitlines()[-num_lines:])
