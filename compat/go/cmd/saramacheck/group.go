package main

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/IBM/sarama"

	"pybroker/compat/go/internal/report"
	"pybroker/compat/go/internal/tally"
)

const partitions = 3

// groupScenario: the ClusterAdmin creates and describes a topic of 3 partitions; the members
// of a ConsumerGroup (Sarama's default range strategy, eager) join; once each holds its own
// partitions a SyncProducer (acks=all, idempotent) sends N keyed records; the members mark
// each record they read and commit at the end of their session.  The committed offsets are
// then read back twice (ClusterAdmin's OffsetFetch and an OffsetManager) beside the end
// offsets, and the group is described.
func groupScenario(ctx context.Context, flags report.Flags, config *sarama.Config, results map[string]any) error {
	client, err := sarama.NewClient([]string{flags.Bootstrap}, config)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	defer client.Close()
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return fmt.Errorf("cluster admin: %w", err)
	}
	if err := createAndDescribe(admin, flags.Topic, results); err != nil {
		return err
	}
	sendRecords := func() error {
		var err error
		results["produced"], err = produce(flags, config, flags.Records)
		return err
	}
	group := flags.Topic + "-group"
	if results["consumed"], err = consumeInGroup(ctx, flags, config, group, sendRecords); err != nil {
		return err
	}
	return readBackOffsets(client, admin, group, flags.Topic, results)
}

func createAndDescribe(admin sarama.ClusterAdmin, topic string, results map[string]any) error {
	err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1}, false)
	results["create_error"] = code(err)
	if err != nil {
		return fmt.Errorf("create topic: %w", err)
	}
	results["create_again_error"] = code(admin.CreateTopic(topic,
		&sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1}, false))
	described, err := admin.DescribeTopics([]string{topic})
	if err != nil {
		return fmt.Errorf("describe topics: %w", err)
	}
	found := []map[string]any{}
	for _, metadata := range described {
		for _, partition := range metadata.Partitions {
			found = append(found, map[string]any{"partition": partition.ID, "leader": partition.Leader,
				"replicas": partition.Replicas, "isr": partition.Isr, "error": int(partition.Err)})
		}
		results["describe_error"] = int(metadata.Err)
	}
	results["describe"] = found
	return nil
}

// produce sends `count` records keyed key-<i> with one SendMessages call and counts the
// acknowledgements per partition, with the last offset each got.
func produce(flags report.Flags, config *sarama.Config, count int) (map[string]any, error) {
	producer, err := sarama.NewSyncProducer([]string{flags.Bootstrap}, config)
	if err != nil {
		return nil, fmt.Errorf("sync producer: %w", err)
	}
	defer producer.Close()
	messages := make([]*sarama.ProducerMessage, count)
	for i := range messages {
		messages[i] = &sarama.ProducerMessage{Topic: flags.Topic, Key: sarama.StringEncoder(fmt.Sprintf("key-%d", i)),
			Value: sarama.StringEncoder(fmt.Sprintf("value-%d", i))}
	}
	err = producer.SendMessages(messages)
	perPartition := map[string]int{}
	lastOffset := map[string]int64{}
	for _, message := range messages {
		if message.Offset >= 0 {
			key := fmt.Sprint(message.Partition)
			perPartition[key]++
			lastOffset[key] = max(lastOffset[key], message.Offset)
		}
	}
	summary := map[string]any{"per_partition": perPartition, "last_offset": lastOffset,
		"error": code(err), "error_text": errorText(err)}
	if err != nil {
		return summary, fmt.Errorf("send messages: %w", err)
	}
	return summary, nil
}

// consumeInGroup runs `flags.Members` members of the group; once each holds its own
// partitions it calls `produce`, and stops the members once every key was read.
func consumeInGroup(ctx context.Context, flags report.Flags, config *sarama.Config, group string,
	produce func() error) (map[string]any, error) {
	reads := tally.NewReads("")
	assignments := tally.NewAssignments(flags.Members)
	consuming, stop := context.WithCancel(ctx)
	defer stop()
	var members sync.WaitGroup
	memberErrors := make([]string, flags.Members)
	for i := range flags.Members {
		handler := &member{index: i, topic: flags.Topic, reads: reads, assignments: assignments}
		members.Add(1)
		go func() {
			defer members.Done()
			memberErrors[i] = runMember(consuming, flags, config, group, handler)
		}()
	}
	summary := func() map[string]any {
		found := reads.Summary()
		found["assignments"] = assignments.Sorted()
		found["member_errors"] = memberErrors
		return found
	}
	if !tally.WaitFor(ctx, func() bool { return assignments.Spread(partitions) }) {
		stop()
		members.Wait()
		return summary(), fmt.Errorf("the members did not share the partitions before the deadline")
	}
	assigned := assignments.Sorted()
	if err := produce(); err != nil {
		stop()
		members.Wait()
		return summary(), err
	}
	complete := tally.WaitFor(ctx, func() bool { return reads.Distinct() >= flags.Records })
	stop()
	members.Wait()
	found := summary()
	found["assigned_before_produce"] = assigned
	if !complete {
		return found, fmt.Errorf("read %d of %d keys before the deadline", reads.Distinct(), flags.Records)
	}
	return found, nil
}

// runMember is one member: its sessions, one per rebalance, until ctx ends.
func runMember(ctx context.Context, flags report.Flags, config *sarama.Config, group string, handler *member) string {
	consumer, err := sarama.NewConsumerGroup([]string{flags.Bootstrap}, group, config)
	if err != nil {
		return err.Error()
	}
	defer consumer.Close()
	var errorsSeen []string
	var errorsMu sync.Mutex
	go func() {
		for err := range consumer.Errors() {
			errorsMu.Lock()
			errorsSeen = append(errorsSeen, err.Error())
			errorsMu.Unlock()
		}
	}()
	for ctx.Err() == nil {
		if err := consumer.Consume(ctx, []string{flags.Topic}, handler); err != nil {
			return err.Error()
		}
	}
	errorsMu.Lock()
	defer errorsMu.Unlock()
	return strings.Join(errorsSeen, "; ")
}

// member is a ConsumerGroupHandler: it marks each record it reads and commits when its
// session ends (a rebalance, or the member's stop).
type member struct {
	index       int
	topic       string
	reads       *tally.Reads
	assignments *tally.Assignments
}

func (m *member) Setup(session sarama.ConsumerGroupSession) error {
	m.assignments.Set(m.index, session.Claims()[m.topic])
	return nil
}

func (m *member) Cleanup(session sarama.ConsumerGroupSession) error {
	session.Commit()
	m.assignments.Set(m.index, nil)
	return nil
}

func (m *member) ConsumeClaim(session sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for message := range claim.Messages() {
		m.reads.Add(string(message.Key), string(message.Value))
		session.MarkMessage(message, "")
	}
	return nil
}

// readBackOffsets: committed offsets from the ClusterAdmin (OffsetFetch) and from an
// OffsetManager, end offsets from the client (ListOffsets latest), the group's description.
func readBackOffsets(client sarama.Client, admin sarama.ClusterAdmin, group, topic string, results map[string]any) error {
	ids := []int32{0, 1, 2}
	fetched, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: ids})
	if err != nil {
		return fmt.Errorf("list consumer group offsets: %w", err)
	}
	manager, err := sarama.NewOffsetManagerFromClient(group, client)
	if err != nil {
		return fmt.Errorf("offset manager: %w", err)
	}
	defer manager.Close()
	committed, managed, ends := map[string]int64{}, map[string]int64{}, map[string]int64{}
	for _, id := range ids {
		key := fmt.Sprint(id)
		if block := fetched.GetBlock(topic, id); block != nil && block.Err == sarama.ErrNoError {
			committed[key] = block.Offset
		}
		partition, err := manager.ManagePartition(topic, id)
		if err != nil {
			return fmt.Errorf("manage partition %d: %w", id, err)
		}
		managed[key], _ = partition.NextOffset()
		partition.AsyncClose()
		if ends[key], err = client.GetOffset(topic, id, sarama.OffsetNewest); err != nil {
			return fmt.Errorf("end offset of %d: %w", id, err)
		}
	}
	results["committed"], results["offset_manager"], results["end_offsets"] = committed, managed, ends
	described, err := admin.DescribeConsumerGroups([]string{group})
	if err != nil {
		return fmt.Errorf("describe consumer groups: %w", err)
	}
	for _, description := range described {
		results["group"] = map[string]any{"state": description.State, "protocol_type": description.ProtocolType,
			"protocol": description.Protocol, "members": len(description.Members), "error": int(description.Err)}
	}
	return nil
}
