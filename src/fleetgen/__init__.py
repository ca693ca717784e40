"""fleetgen: plan, deploy and verify LLM servers over SSH, then generate training data exactly once."""

__version__ = "0.1.0"

# The engine registry, imported first so that the fleet file's `engine.kind` is checked against every engine
# (`config.register_engine_kind`); config sits left of engines and cannot import it itself.
from fleetgen import engines as _engines  # noqa: F401
