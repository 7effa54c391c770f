"""The transaction coordinator (KIP-98), in the parent."""
