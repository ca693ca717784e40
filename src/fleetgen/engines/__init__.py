"""fleetgen.engines."""
