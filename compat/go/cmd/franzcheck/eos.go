package main

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"pybroker/compat/go/internal/report"
)

// eosScenario: consume-transform-produce with a GroupTransactSession.  N records go to the
// input topic; the session reads them in a group and, in transactions, writes each one's
// copy to <topic>-out together with the group's offsets (AddOffsetsToTxn, TxnOffsetCommit).
// The group's committed offsets must then equal the input's end offsets, and a
// read_committed reader of the output must find N records, each once.
func eosScenario(ctx context.Context, flags report.Flags, results map[string]any) error {
	output := flags.Topic + "-out"
	producer, err := newClient(flags, kgo.DefaultProduceTopic(flags.Topic))
	if err != nil {
		return err
	}
	defer producer.Close()
	admin := kadm.NewClient(producer)
	for _, topic := range []string{flags.Topic, output} {
		if err := createTopic(ctx, admin, topic, 3); err != nil {
			return err
		}
	}
	if results["produced"], err = produceKeyed(ctx, producer, flags.Records, ""); err != nil {
		return err
	}
	group := flags.Topic + "-eos"
	copied, err := copyInTransactions(ctx, flags, group, output)
	results["copied"] = copied
	if err != nil {
		return err
	}
	if err := describeGroupOffsets(ctx, admin, group, flags.Topic, results); err != nil {
		return err
	}
	results["output"], err = readCommitted(ctx, flags, output, flags.Records)
	return err
}

// copyInTransactions copies every input record to `output`, one transaction per poll.
func copyInTransactions(ctx context.Context, flags report.Flags, group, output string) (map[string]any, error) {
	session, err := kgo.NewGroupTransactSession(kgo.SeedBrokers(flags.Bootstrap), kgo.ClientID("franzcheck"),
		kgo.TransactionalID(group+"-txn"), kgo.ConsumerGroup(group), kgo.ConsumeTopics(flags.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RequireStableFetchOffsets())
	if err != nil {
		return nil, err
	}
	defer session.Close()
	copied, transactions := 0, 0
	summary := func() map[string]any { return map[string]any{"records": copied, "transactions": transactions} }
	for copied < flags.Records && ctx.Err() == nil {
		fetches := session.PollFetches(ctx)
		if err := fetches.Err(); err != nil && ctx.Err() == nil {
			return summary(), fmt.Errorf("poll: %w", err)
		}
		if fetches.NumRecords() == 0 {
			continue
		}
		if err := session.Begin(); err != nil {
			return summary(), fmt.Errorf("begin: %w", err)
		}
		var copies []*kgo.Record
		fetches.EachRecord(func(record *kgo.Record) {
			copies = append(copies, &kgo.Record{Topic: output, Key: record.Key, Value: record.Value})
		})
		if err := session.ProduceSync(ctx, copies...).FirstErr(); err != nil {
			return summary(), fmt.Errorf("produce copies: %w", err)
		}
		committed, err := session.End(ctx, kgo.TryCommit)
		if err != nil {
			return summary(), fmt.Errorf("end: %w", err)
		}
		if committed {
			copied += len(copies)
			transactions++
		}
	}
	if copied < flags.Records {
		return summary(), fmt.Errorf("copied %d of %d records before the deadline", copied, flags.Records)
	}
	return summary(), nil
}

// readCommitted reads `topic` from its start, read_committed and outside any group, until
// `want` records arrived, and counts them and their distinct keys.
func readCommitted(ctx context.Context, flags report.Flags, topic string, want int) (map[string]any, error) {
	reader, err := newClient(flags, kgo.ConsumeTopics(topic), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, err
	}
	defer reader.Close()
	keys := map[string]bool{}
	read := 0
	for read < want && ctx.Err() == nil {
		fetches := reader.PollFetches(ctx)
		if err := fetches.Err(); err != nil && ctx.Err() == nil {
			return nil, fmt.Errorf("poll: %w", err)
		}
		fetches.EachRecord(func(record *kgo.Record) {
			read++
			keys[string(record.Key)] = true
		})
	}
	summary := map[string]any{"read": read, "distinct_keys": len(keys)}
	if read < want {
		return summary, fmt.Errorf("read %d of %d records before the deadline", read, want)
	}
	return summary, nil
}
