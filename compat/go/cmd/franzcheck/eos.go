package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"pybroker/compat/go/internal/report"
	"pybroker/compat/go/internal/tally"
)

// recordsPerTransaction bounds a poll, so the copy takes several transactions.
const recordsPerTransaction = 50

// eosScenario: consume-transform-produce with GroupTransactSessions.  N records (valued
// in-value-<i>) go to the input topic; the members of a group read them and, one transaction
// per poll, write each one's copy to <topic>-out together with the group's offsets
// (AddOffsetsToTxn, TxnOffsetCommit).  The first member starts alone and each next one joins
// once its share of the records was copied, so the group rebalances while transactions are
// open (a session aborts a transaction whose partitions were revoked).  Once the group's
// committed offsets reach the input's end offsets the members stop, an end record goes to
// each output partition, and a read_committed reader of the output must find every input
// record exactly once.
func eosScenario(ctx context.Context, flags report.Flags, results map[string]any) error {
	output := flags.Topic + "-out"
	producer, admin, err := withTopics(ctx, flags, []string{flags.Topic, output}, kgo.DefaultProduceTopic(flags.Topic))
	if err != nil {
		return err
	}
	defer producer.Close()
	if results["produced"], err = produceKeyed(ctx, producer, flags.Records, "in-"); err != nil {
		return err
	}
	group := flags.Topic + "-eos"
	copied, err := copyWithMembers(ctx, flags, admin, group, output)
	results["copied"] = copied
	if err != nil {
		return err
	}
	if err := describeGroupOffsets(ctx, admin, group, flags.Topic, results); err != nil {
		return err
	}
	if err := writeEndMarks(ctx, flags, output); err != nil {
		return err
	}
	results["output"], err = readToEndMarks(ctx, flags, output, kgo.ReadCommitted())
	return err
}

// copied counts the records whose copies were committed or aborted, and the commits.
type copied struct {
	committed, aborted, transactions atomic.Int64
}

// copyWithMembers starts the group's members one after the other and stops them once the
// group's committed offsets equal the input's end offsets.
func copyWithMembers(ctx context.Context, flags report.Flags, admin *kadm.Client, group, output string) (map[string]any, error) {
	var counts copied
	copying, stop := context.WithCancel(ctx)
	defer stop()
	var members sync.WaitGroup
	memberErrors := make([]string, flags.Members)
	held := map[string]any{}
	for i := range flags.Members {
		share := int64(flags.Records * i / flags.Members)
		if !tally.WaitFor(ctx, func() bool { return counts.committed.Load() >= share }) {
			break
		}
		member := &copier{flags: flags, group: group, output: output, index: i, counts: &counts}
		if i == 0 && flags.Members > 1 {
			member.holdAt = int64(flags.Records / flags.Members)
			member.held = held
		}
		members.Add(1)
		go func() {
			defer members.Done()
			memberErrors[i] = member.run(ctx, copying)
		}()
	}
	caughtUp := tally.WaitFor(ctx, func() bool { return groupCaughtUp(ctx, admin, group, flags.Topic) })
	stop()
	members.Wait()
	summary := map[string]any{"committed_records": counts.committed.Load(),
		"aborted_records": counts.aborted.Load(), "transactions": counts.transactions.Load(),
		"member_errors": memberErrors, "held": held}
	if !caughtUp {
		return summary, fmt.Errorf("the group did not commit the input's end offsets before the deadline")
	}
	return summary, nil
}

// copier is one member of the group.  The first member, when others follow, holds one
// transaction open once `holdAt` copies are committed (when the second member joins) until
// the rebalance revokes partitions from it, then tries to commit it: the session must abort.
type copier struct {
	flags         report.Flags
	group, output string
	index         int
	counts        *copied
	holdAt        int64          // 0: never hold
	held          map[string]any // what became of the held transaction
	revoked       atomic.Bool
}

// run polls until `copying` ends and copies each poll's records in a transaction.  The
// first error, as text.
func (c *copier) run(ctx, copying context.Context) string {
	session, err := kgo.NewGroupTransactSession(kgo.SeedBrokers(c.flags.Bootstrap), kgo.ClientID("franzcheck"),
		kgo.TransactionalID(fmt.Sprintf("%s-txn-%d", c.group, c.index)), kgo.ConsumerGroup(c.group),
		kgo.ConsumeTopics(c.flags.Topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.RequireStableFetchOffsets(),
		kgo.HeartbeatInterval(100*time.Millisecond),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
			if len(revoked[c.flags.Topic]) > 0 {
				c.revoked.Store(true)
			}
		}))
	if err != nil {
		return err.Error()
	}
	defer session.Close()
	for copying.Err() == nil {
		fetches := session.PollRecords(copying, recordsPerTransaction)
		if err := fetches.Err(); err != nil && copying.Err() == nil {
			return "poll: " + report.Code(err)
		}
		if fetches.NumRecords() == 0 {
			continue
		}
		if err := c.copyInTransaction(ctx, session, fetches); err != nil {
			return err.Error()
		}
	}
	return ""
}

func (c *copier) copyInTransaction(ctx context.Context, session *kgo.GroupTransactSession, fetches kgo.Fetches) error {
	if err := session.Begin(); err != nil {
		return fmt.Errorf("begin: %s", report.Code(err))
	}
	var copies []*kgo.Record
	fetches.EachRecord(func(record *kgo.Record) {
		copies = append(copies, &kgo.Record{Topic: c.output, Key: record.Key, Value: record.Value})
	})
	produceErr := session.ProduceSync(ctx, copies...).FirstErr()
	holding := c.holdAt > 0 && len(c.held) == 0 && c.counts.committed.Load() >= c.holdAt
	if holding {
		waiting, stop := context.WithTimeout(ctx, 10*time.Second)
		c.held["revoked"] = tally.WaitFor(waiting, c.revoked.Load)
		stop()
	}
	// A failed produce makes End abort: the records are read again, by whoever holds them.
	committed, err := session.End(ctx, produceErr == nil)
	if holding {
		c.held["committed"], c.held["records"] = committed, len(copies)
	}
	if err != nil {
		return fmt.Errorf("end: %s", report.Code(err))
	}
	if committed {
		c.counts.committed.Add(int64(len(copies)))
		c.counts.transactions.Add(1)
	} else {
		c.counts.aborted.Add(int64(len(copies)))
	}
	return nil
}

// groupCaughtUp: the group's committed offsets equal the topic's end offsets.
func groupCaughtUp(ctx context.Context, admin *kadm.Client, group, topic string) bool {
	committed, errCommitted := committedOffsets(ctx, admin, group, topic)
	end, errEnd := endOffsets(ctx, admin, topic)
	if errCommitted != nil || errEnd != nil || len(committed) != len(end) {
		return false
	}
	for partition, offset := range end {
		if committed[partition] != offset {
			return false
		}
	}
	return true
}

// writeEndMarks writes end-value-<p> to each partition p of `topic`, outside any transaction.
func writeEndMarks(ctx context.Context, flags report.Flags, topic string) error {
	writer, err := newClient(flags, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return err
	}
	defer writer.Close()
	marks := make([]*kgo.Record, topicPartitions)
	for p := range marks {
		marks[p] = &kgo.Record{Partition: int32(p), Value: []byte(fmt.Sprintf("end-value-%d", p))}
	}
	if err := writer.ProduceSync(ctx, marks...).FirstErr(); err != nil {
		return fmt.Errorf("end marks: %w", err)
	}
	return nil
}
