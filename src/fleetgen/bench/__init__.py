"""fleetgen.bench: `fleetgen bench`, a concurrency sweep of streaming requests against engines."""
