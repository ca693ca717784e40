"""fleetgen.remote."""
