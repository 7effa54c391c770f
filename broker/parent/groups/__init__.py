"""Consumer groups, in the parent: the coordinator (the group table, the dispatch of the group
APIs, the timer), membership and rebalances (membership.py) and the saved generations
(membership_store.py), the offset APIs (offsets.py) and the committed offsets
(offset_store.py), listing, and the state of one group."""
