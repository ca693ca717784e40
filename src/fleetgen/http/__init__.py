"""fleetgen.http: HTTP to an engine (`client`) and the numbers it reports (`metrics`)."""
