"""Kafka wire protocol helpers shared by the parent, the workers and the tests."""
