"""Consumer groups: the coordinator (in the parent) and the durable committed offsets."""
