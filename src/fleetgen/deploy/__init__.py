"""fleetgen.deploy."""
