"""Transactions (KIP-98): the coordinator, the log's half, real transactional clients."""
