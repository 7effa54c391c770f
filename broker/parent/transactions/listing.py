"""DescribeTransactions and ListTransactions: which transactions of the coordinator's table a
caller sees, and what of each (answers.py writes the answers as bytes).

Both only read the table.  DescribeTransactions answers an id named twice once (Kafka's admin
client keys the answers by id) and shows only the partitions of topics the caller may
describe, as Kafka's KafkaApis filters them; ListTransactions shows the ids the caller may
describe among those its filters select.
"""

from __future__ import annotations

from broker.parent.transactions.answers import (describe_transactions_body,
                                                list_transactions_body)
from broker.parent.transactions.state import Transaction, TxnState
from broker.shared.clock import now_ms
from broker.shared.access import Access
from broker.shared.acl import Operation, ResourceType
from broker.shared.protocol.context import RequestContext
from broker.shared.protocol.errors import ErrorCode


def describe(ctx: RequestContext, body, transactions: dict[str, Transaction], access: Access,
             budget) -> bytes:
    """One state per id named; each id's partitions are charged to `budget` (the forwarded
    answer's, broker.parent.forwarded) before they are gathered."""
    states, describable = [], _describable(ctx, access)
    for transactional_id in dict.fromkeys(body.transactional_ids):
        txn = transactions.get(transactional_id)
        code = ErrorCode.none
        if not access.check(ctx, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID,
                            transactional_id):
            code, txn = ErrorCode.transactional_id_authorization_failed, None
        elif txn is None:
            code = ErrorCode.transactional_id_not_found
        budget.charge(len(transactional_id) + 8 * len(txn.partitions if txn else ()),
                      1 + len(txn.partitions if txn else ()))
        states.append(_described(transactional_id, code, txn, describable))
    return ctx.frame(describe_transactions_body(states))


def list_transactions(ctx: RequestContext, body, transactions: dict[str, Transaction],
                      access: Access) -> bytes:
    """Every transaction the filters select and the caller may describe.  The one small
    request that answers with the whole table: its answer is written straight to bytes
    (answers.py), and each id costs a few attribute reads."""
    known = {state.value for state in TxnState}
    wanted = set(body.state_filters)
    producers = set(body.producer_id_filters)
    longer_than = getattr(body, "duration_filter", -1)
    selected = transactions.values()
    if wanted:
        selected = [txn for txn in selected if txn.state._value_ in wanted]
    if producers:
        selected = [txn for txn in selected if txn.producer_id in producers]
    if longer_than >= 0:
        began_before = now_ms() - longer_than
        selected = [txn for txn in selected if txn.state is TxnState.ONGOING
                    and txn.started_ms <= began_before]
    if access.enabled:
        allowed = access.allowed
        selected = [txn for txn in selected if allowed(
            ctx, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, txn.transactional_id)]
    listed = [(txn.transactional_id, txn.producer_id, txn.state._value_)
              for txn in selected]
    return ctx.frame(list_transactions_body(ErrorCode.none, sorted(wanted - known), listed))


def _describable(ctx: RequestContext, access: Access):
    """The test of a topic the caller may see in an answer (decided once per topic)."""
    decided: dict[str, bool] = {}

    def describable(topic: str) -> bool:
        if topic not in decided:
            decided[topic] = access.check(ctx, Operation.DESCRIBE, ResourceType.TOPIC, topic)
        return decided[topic]
    return describable


def _described(transactional_id: str, code, txn: Transaction | None, describable) -> tuple:
    """One state of a DescribeTransactions answer (answers.describe_transactions_body): the
    partitions of a transaction in progress, of the topics the caller may describe."""
    if txn is None:
        return code, transactional_id, "", 0, -1, -1, -1, {}
    topics: dict[str, list[int]] = {}
    if txn.state is TxnState.ONGOING or txn.state.preparing:
        for name, partition in txn.partitions:
            if name in topics or describable(name):
                topics.setdefault(name, []).append(partition)
    # A start time of -1: none yet (Kafka's).
    return (code, transactional_id, txn.state._value_, txn.timeout_ms, txn.started_ms,
            txn.producer_id, txn.producer_epoch, topics)
