"""fleetgen.generate."""
