"""TLS, SASL, certificate principals and ACLs."""
