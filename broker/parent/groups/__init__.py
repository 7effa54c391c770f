"""Consumer groups, in the parent: the coordinator (the group table, its files, the dispatch
of the group APIs), membership and rebalances, committed offsets, listing, and the state of
one group."""
