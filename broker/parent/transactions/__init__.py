"""The transaction coordinator (KIP-98), in the parent.

coordinator.py  requests, each id's state machine and the transaction log; the owner
markers.py      the markers that end a transaction in its partitions, and those owed
sweeps.py       the rounds: markers retried, timed-out and hanging transactions aborted,
                idle ids expired
listing.py      what DescribeTransactions and ListTransactions show
state.py        a transactional id's state, its legal moves, the clock of its times
holders.py      who holds the ids, and each holder's fair share
refusals.py     what an operator sees at those bounds: counts, a log line, events
answers.py      ListTransactions and DescribeTransactions answers written as bytes
metrics.py      the coordinator's figures for /metrics
"""
