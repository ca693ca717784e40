"""fleetgen: plan, deploy and verify LLM servers across SSH hosts, then generate training data exactly once."""

__version__ = "0.1.0"
