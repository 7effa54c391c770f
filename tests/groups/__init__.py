"""Consumer groups: the coordinator in process and real clients in groups."""
