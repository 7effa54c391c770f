"""Client quotas and throttling (KIP-219): rates, buckets, what clients see."""
