"""`fleetgen init [PATH]`: write a commented example fleet file (never over an existing file)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

import fleetgen.cli.app as cli
from fleetgen.engines import ENGINES
from fleetgen.errors import ConfigError

EXAMPLE_FLEET = """\
# fleetgen fleet file: WHAT to run ([engine]) and WHERE ([[hosts]], or a Slurm [cluster] at the end).
# Next: `fleetgen hosts check` probes every host; `fleetgen plan` sizes memory; `fleetgen up` deploys.

[engine]
kind = "sglang"                    # ENGINE_KINDS
# version = "0.5.23"               # the engine version you expect on the hosts
python = "/opt/venv/bin/python"    # the python that has the engine installed, same path on every host
model = "/models/Qwen3-8B"         # the model folder, same path on every host
# served_model_name = "qwen3-8b"   # the name clients ask for (default: the folder name)
tp = 1                             # GPUs per instance (tensor parallel): one instance per `tp` GPUs
base_port = 30000                  # instance k of a host listens on base_port + k
bind = "127.0.0.1"                 # loopback: fleetgen reaches the servers through SSH tunnels
# api_key_env = "FLEETGEN_API_KEY" # required when bind is not 127.0.0.1 (the servers are then public)

[engine.args]                      # engine flags, names WITHOUT dashes; fleetgen sets host/port itself
context-length = 32768
# mem-fraction-static = 0.85

[engine.env]                       # exported by the launch script on the host
# HF_HUB_OFFLINE = "1"

[[hosts]]
name = "gpu1"
ssh = "ubuntu@gpu1.example.com:22" # user@host:port, or "local" for this machine
# identity = "~/.ssh/id_ed25519"   # key file (default: ssh-agent and ~/.ssh/id_*)
# known_hosts = "~/.ssh/known_hosts"  # host keys are ALWAYS checked (trust one: ssh-keyscan)
gpus = "all"                       # or GPU indices, e.g. [0, 1, 2, 3]
workdir = "~/fleetgen"             # launch scripts, pid files and logs live here
# base_port = 31000                # per-host override of engine.base_port

[[hosts]]
name = "here"
ssh = "local"
gpus = [0]

# Or let a Slurm cluster place the servers: remove every [[hosts]] entry and uncomment this table
# (one job per server; every key in README.md, "From SSH hosts to Slurm to Ray").
# [cluster]
# kind = "slurm"
# partition = "gpu"                # checked before anything is queued: MaxTime, nodes, accounts, GPUs
# gpus = 16                        # servers = gpus / engine.tp, one job each
# time = "3-00:00:00"              # each server's job time limit, as sbatch --time takes it
# account = "my-project"           # optional (default: your default account)
# sbatch_args = ["--qos=normal"]   # any other sbatch option
# workdir = "/shared/fleetgen"     # on a filesystem the submit host and the nodes share
# submit = "local"                 # where sbatch runs: this machine, or "user@login-node:22"
# node_access = "ssh"              # reach an allocated node by "ssh" (its NodeAddr), "local" or "srun"
# node_ssh_user = "me"             # optional: the user for SSH to a node
# node_ssh_port = 22
# base_port = 30000                # server k listens on base_port + k on its node
# pending_timeout_s = 3600         # how long `up` waits for an allocation
# gpu_memory_gib = 80              # for `fleetgen plan --offline`
"""


@cli.app.command("init")
def init(
    path: Annotated[Path, typer.Argument(help="Where to write the example.")] = Path("fleet.toml"),
) -> None:
    """Write a commented example fleet file to PATH (refuses to overwrite)."""
    cli.execute(_write_example(path))
    cli.console.print(
        f"wrote {path}: edit [[hosts]] and [engine], then run `fleetgen hosts check -f {path}`", markup=False
    )


async def _write_example(path: Path) -> None:
    try:
        with path.open("x", encoding="utf-8") as fh:  # "x": never replace a file the user already wrote
            fh.write(EXAMPLE_FLEET.replace("ENGINE_KINDS", " or ".join(f'"{k}"' for k in ENGINES)))
    except FileExistsError as exc:
        raise ConfigError(
            f"{path} exists already; fleetgen init does not overwrite files",
            fix=f"pass another path (fleetgen init other.toml) or remove {path} first",
        ) from exc
