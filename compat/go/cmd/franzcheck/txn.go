package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"pybroker/compat/go/internal/report"
)

// txnScenario: a transactional producer commits N records, aborts N others, then commits one
// end-<partition> record to each partition.  A read_committed reader must see the committed
// records and the end records and no aborted one; a read_uncommitted reader sees all three
// kinds, which shows the aborted records were written.  kadm describes the transaction and
// lists the end offsets (high watermark) and the committed ones (last stable offset).
func txnScenario(ctx context.Context, flags report.Flags, results map[string]any) error {
	txnID := flags.Topic + "-txn"
	producer, admin, err := withTopics(ctx, flags, []string{flags.Topic}, kgo.DefaultProduceTopic(flags.Topic),
		kgo.TransactionalID(txnID), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return err
	}
	defer producer.Close()
	rounds := []struct {
		name   string
		count  int
		commit kgo.TransactionEndTry
	}{{"committed", flags.Records, kgo.TryCommit}, {"aborted", flags.Records, kgo.TryAbort},
		{"end", topicPartitions, kgo.TryCommit}}
	for _, round := range rounds {
		produced, err := transaction(ctx, producer, round.name, round.count, round.commit)
		results[round.name] = produced
		if err != nil {
			return err
		}
	}
	if err := describeTransaction(ctx, admin, txnID, flags.Topic, results); err != nil {
		return err
	}
	for _, isolation := range []kgo.IsolationLevel{kgo.ReadCommitted(), kgo.ReadUncommitted()} {
		name := map[bool]string{true: "read_committed", false: "read_uncommitted"}[isolation == kgo.ReadCommitted()]
		seen, err := readToEndMarks(ctx, flags, flags.Topic, isolation)
		results[name] = seen
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return listStableOffsets(ctx, admin, flags.Topic, results)
}

// transaction: begin, `count` records valued <name>-value-<i> spread over the partitions in
// turn, end with `commit`.
func transaction(ctx context.Context, producer *kgo.Client, name string, count int,
	commit kgo.TransactionEndTry) (map[string]any, error) {
	if err := producer.BeginTransaction(); err != nil {
		return nil, fmt.Errorf("begin %s: %w", name, err)
	}
	records := make([]*kgo.Record, count)
	for i := range records {
		records[i] = &kgo.Record{Partition: int32(i % topicPartitions), Key: []byte(fmt.Sprintf("key-%d", i)),
			Value: []byte(fmt.Sprintf("%s-value-%d", name, i))}
	}
	answers := producer.ProduceSync(ctx, records...)
	summary := map[string]any{"produce_error": report.Code(answers.FirstErr()), "acknowledged": len(answers)}
	if err := answers.FirstErr(); err != nil {
		summary["end_error"] = report.Code(producer.EndTransaction(ctx, kgo.TryAbort))
		return summary, fmt.Errorf("produce %s: %w", name, err)
	}
	err := producer.EndTransaction(ctx, commit)
	summary["end_error"] = report.Code(err)
	if err != nil {
		return summary, fmt.Errorf("end %s: %w", name, err)
	}
	return summary, nil
}

// readToEndMarks reads the topic from its start, outside any group, until every partition's
// end-value-<partition> record arrived; it counts the records by the kind their value names
// (<kind>-value-<i>), and under "distinct" the distinct values.
func readToEndMarks(ctx context.Context, flags report.Flags, topic string, isolation kgo.IsolationLevel) (map[string]int, error) {
	reader, err := newClient(flags, kgo.ConsumeTopics(topic), kgo.FetchIsolationLevel(isolation),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, err
	}
	defer reader.Close()
	seen := map[string]int{}
	values := map[string]bool{}
	for seen["end"] < topicPartitions && ctx.Err() == nil {
		fetches := reader.PollFetches(ctx)
		if err := fetches.Err(); err != nil && ctx.Err() == nil {
			return seen, fmt.Errorf("poll: %w", err)
		}
		fetches.EachRecord(func(record *kgo.Record) {
			kind, _, _ := strings.Cut(string(record.Value), "-value-")
			seen[kind]++
			values[string(record.Value)] = true
		})
	}
	seen["distinct"] = len(values)
	if seen["end"] < topicPartitions {
		return seen, fmt.Errorf("%d of %d end records before the deadline", seen["end"], topicPartitions)
	}
	return seen, nil
}

func describeTransaction(ctx context.Context, admin *kadm.Client, txnID, topic string, results map[string]any) error {
	described, err := admin.DescribeTransactions(ctx, txnID)
	if err != nil {
		return fmt.Errorf("describe transactions: %w", err)
	}
	txn := described[txnID]
	results["described"] = map[string]any{"state": txn.State, "producer_id": txn.ProducerID,
		"producer_epoch": txn.ProducerEpoch, "timeout_ms": txn.TimeoutMillis,
		"partitions": len(txn.Topics.Sorted()), "error": report.Code(txn.Err)}
	listed, err := admin.ListTransactions(ctx, nil, nil)
	if err != nil {
		return fmt.Errorf("list transactions: %w", err)
	}
	if entry, ok := listed[txnID]; ok {
		results["listed"] = map[string]any{"state": entry.State, "producer_id": entry.ProducerID}
	}
	return describeProducers(ctx, admin, topic, results)
}

// describeProducers: the producers partition 0 of `topic` knows (DescribeProducers).
func describeProducers(ctx context.Context, admin *kadm.Client, topic string, results map[string]any) error {
	described, err := admin.DescribeProducers(ctx, kadm.TopicsSet{topic: {0: {}}})
	if err != nil {
		return fmt.Errorf("describe producers: %w", err)
	}
	producers := []map[string]any{}
	for _, producer := range described.SortedProducers() {
		producers = append(producers, map[string]any{"producer_id": producer.ProducerID,
			"producer_epoch": producer.ProducerEpoch, "last_sequence": producer.LastSequence,
			"current_txn_start_offset": producer.CurrentTxnStartOffset})
	}
	results["producers"] = producers
	return nil
}

// listStableOffsets: the high watermarks beside the last stable offsets.
func listStableOffsets(ctx context.Context, admin *kadm.Client, topic string, results map[string]any) error {
	var err error
	if results["end_offsets"], err = endOffsets(ctx, admin, topic); err != nil {
		return err
	}
	stable, err := admin.ListCommittedOffsets(ctx, topic)
	if err != nil {
		return fmt.Errorf("list committed offsets: %w", err)
	}
	results["stable_offsets"], err = offsetsOf(stable, topic)
	return err
}
