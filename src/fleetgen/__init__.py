"""fleetgen: plan, deploy and verify LLM servers over SSH, then generate training data exactly once."""

__version__ = "0.1.0"
