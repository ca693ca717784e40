"""fleetgen.sim."""
