"""What the deploy unit tests share: a launch `Command` and its secret (test_script.py, test_verify.py)."""

from __future__ import annotations

from fleetgen.deploy.script import (
    Command,
    InstancePaths,
    SecretEnv,
)

SECRET = "sk-very-secret-123"


def command(
    tmp: str = "/w", secret: bool = False, args: tuple[str, ...] = ("--model-path", "/m x", "--port", "1")
) -> Command:
    extra = ("--config", "api_key.yaml") if secret else ()
    return Command(
        instance="h0-0",
        python="/opt/venv/bin/python",
        launcher=("-m", "sglang.launch_server"),
        args=(*args, *extra),
        env={"CUDA_VISIBLE_DEVICES": "0", "QUOTE": "it's $HOME"},
        paths=InstancePaths.of(tmp, "h0-0"),
        secret=SecretEnv("FLEET_KEY", config_key="api-key") if secret else None,
    )
