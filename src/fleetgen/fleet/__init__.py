"""fleetgen.fleet."""
