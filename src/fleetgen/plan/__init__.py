"""fleetgen.plan."""
