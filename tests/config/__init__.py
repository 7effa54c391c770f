"""Configuration: keys, files, overrides, secrets."""
