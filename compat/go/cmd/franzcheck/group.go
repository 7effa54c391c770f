package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"pybroker/compat/go/internal/report"
	"pybroker/compat/go/internal/tally"
)

// groupScenario: the members of a consumer group (kgo's ConsumerGroup, cooperative-sticky)
// share a topic of 3 partitions; once each holds its own, N keyed records are produced
// idempotently (kgo's default, acks=all); the members read them all, commit and leave.  kadm
// then reads the group's committed offsets, the end offsets and the group's description.
// Last, 10 more records go out and one new member of the group must read exactly those: it
// starts at the committed offsets.
func groupScenario(ctx context.Context, flags report.Flags, results map[string]any) error {
	producer, admin, err := withTopics(ctx, flags, []string{flags.Topic}, kgo.DefaultProduceTopic(flags.Topic))
	if err != nil {
		return err
	}
	defer producer.Close()
	group := flags.Topic + "-group"
	rounds := []struct {
		name, prefix string
		members      int
		records      int
	}{{"consumed", "", flags.Members, flags.Records}, {"resumed", "again-", 1, resumeRecords}}
	for _, round := range rounds {
		produce := func() error {
			produced, err := produceKeyed(ctx, producer, round.records, round.prefix)
			results["produced_"+round.name] = produced
			return err
		}
		consumed, err := consumeInGroup(ctx, flags, group, round.members, tally.NewReads(round.prefix),
			round.records, produce)
		results[round.name] = consumed
		if err != nil {
			return fmt.Errorf("%s: %w", round.name, err)
		}
		if round.name == "consumed" {
			if err := describeGroupOffsets(ctx, admin, group, flags.Topic, results); err != nil {
				return err
			}
		}
	}
	return nil
}

// resumeRecords are produced after the group's commit, for its next member to read.
const resumeRecords = 10

// produceKeyed sends `count` records keyed <prefix>key-<i> and valued <prefix>value-<i>, and
// counts the answers per partition with the last offset each got.
func produceKeyed(ctx context.Context, client *kgo.Client, count int, prefix string) (map[string]any, error) {
	records := make([]*kgo.Record, count)
	for i := range records {
		records[i] = &kgo.Record{Key: []byte(fmt.Sprintf("%skey-%d", prefix, i)),
			Value: []byte(fmt.Sprintf("%svalue-%d", prefix, i))}
	}
	answers := client.ProduceSync(ctx, records...)
	perPartition := map[string]int{}
	lastOffset := map[string]int64{}
	acknowledged := 0
	for _, answer := range answers {
		if answer.Err != nil {
			continue
		}
		acknowledged++
		partition := fmt.Sprint(answer.Record.Partition)
		perPartition[partition]++
		lastOffset[partition] = max(lastOffset[partition], answer.Record.Offset)
	}
	summary := map[string]any{"acknowledged": acknowledged, "per_partition": perPartition,
		"last_offset": lastOffset, "producer_id": answers[0].Record.ProducerID,
		"error": report.Code(answers.FirstErr())}
	if err := answers.FirstErr(); err != nil {
		return summary, fmt.Errorf("produce: %w", err)
	}
	return summary, nil
}

// consumeInGroup starts `members` members of `group`; once each holds its own partitions it
// calls `produce`, then reads until `want` distinct keys arrived, commits each member's offsets
// and closes them.
func consumeInGroup(ctx context.Context, flags report.Flags, group string, members int, reads *tally.Reads,
	want int, produce func() error) (map[string]any, error) {
	assignments := tally.NewAssignments(members)
	clients := make([]*kgo.Client, members)
	defer func() {
		for _, client := range clients {
			if client != nil {
				client.Close()
			}
		}
	}()
	for i := range clients {
		var err error
		if clients[i], err = newMember(flags, group, i, assignments); err != nil {
			return nil, err
		}
	}
	polling, stopPolling := context.WithCancel(ctx)
	defer stopPolling()
	var pollers sync.WaitGroup
	pollErrors := make([]string, members)
	for i, client := range clients {
		pollers.Add(1)
		go func() {
			defer pollers.Done()
			pollErrors[i] = poll(polling, client, reads)
		}()
	}
	summary := func() map[string]any {
		found := reads.Summary()
		found["assignments"] = assignments.Sorted()
		found["poll_errors"] = pollErrors
		return found
	}
	spread := tally.WaitFor(ctx, func() bool { return assignments.Spread(topicPartitions) })
	if !spread {
		stopPolling()
		pollers.Wait()
		return summary(), fmt.Errorf("the members did not share the partitions before the deadline")
	}
	assigned := assignments.Sorted()
	if err := produce(); err != nil {
		return summary(), err
	}
	complete := tally.WaitFor(ctx, func() bool { return reads.Distinct() >= want })
	stopPolling()
	pollers.Wait()
	found := summary()
	found["assigned_before_produce"] = assigned
	commitErrors := make([]string, members)
	for i, client := range clients {
		commitErrors[i] = report.Code(client.CommitUncommittedOffsets(ctx))
	}
	found["commit_errors"] = commitErrors
	if !complete {
		return found, fmt.Errorf("read %d of %d keys before the deadline", reads.Distinct(), want)
	}
	return found, nil
}

// newMember is one member of the group: it commits what it read before it gives partitions
// up, as a member that commits by hand must.
func newMember(flags report.Flags, group string, i int, assignments *tally.Assignments) (*kgo.Client, error) {
	return newClient(flags, kgo.ConsumerGroup(group), kgo.ConsumeTopics(flags.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit(),
		kgo.HeartbeatInterval(200*time.Millisecond),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, added map[string][]int32) {
			assignments.Add(i, added[flags.Topic])
		}),
		kgo.OnPartitionsRevoked(func(ctx context.Context, client *kgo.Client, revoked map[string][]int32) {
			client.CommitUncommittedOffsets(ctx)
			assignments.Remove(i, revoked[flags.Topic])
		}),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
			assignments.Remove(i, lost[flags.Topic])
		}))
}

// poll reads until ctx ends; the first error that is not ctx's own is returned as text.
func poll(ctx context.Context, client *kgo.Client, reads *tally.Reads) string {
	for ctx.Err() == nil {
		fetches := client.PollFetches(ctx)
		if err := fetches.Err(); err != nil && ctx.Err() == nil {
			return report.Code(err)
		}
		fetches.EachRecord(func(record *kgo.Record) { reads.Add(string(record.Key), string(record.Value)) })
	}
	return ""
}

// describeGroupOffsets: the group's committed offsets (OffsetFetch) beside the topic's end
// offsets (ListOffsets latest), and the group's state once its members left.
func describeGroupOffsets(ctx context.Context, admin *kadm.Client, group, topic string, results map[string]any) error {
	var err error
	if results["committed"], err = committedOffsets(ctx, admin, group, topic); err != nil {
		return err
	}
	if results["end_offsets"], err = endOffsets(ctx, admin, topic); err != nil {
		return err
	}
	described, err := admin.DescribeGroups(ctx, group)
	if err != nil {
		return fmt.Errorf("describe group: %w", err)
	}
	results["group"] = map[string]any{"state": described[group].State,
		"protocol_type": described[group].ProtocolType, "members": len(described[group].Members),
		"error": report.Code(described[group].Err)}
	return nil
}
