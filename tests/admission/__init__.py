"""Connection admission (KIP-402, KIP-612): limits, rates, PROXY headers, refusals, shadow limits."""
