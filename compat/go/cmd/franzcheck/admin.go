package main

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"pybroker/compat/go/internal/report"
)

// adminScenario: kadm creates a topic of 3 partitions, creates it again (refused), describes
// it (partitions, leaders, replicas) and reads its configs, then deletes it.
func adminScenario(ctx context.Context, flags report.Flags, results map[string]any) error {
	client, err := newClient(flags)
	if err != nil {
		return err
	}
	defer client.Close()
	admin := kadm.NewClient(client)

	created, err := admin.CreateTopic(ctx, 3, 1, map[string]*string{"retention.ms": kadm.StringPtr("3600000")}, flags.Topic)
	results["create"] = map[string]any{"partitions": created.NumPartitions,
		"replication_factor": created.ReplicationFactor, "error": report.Code(err), "topic_id": created.ID.String()}
	if err != nil {
		return fmt.Errorf("create topic: %w", err)
	}
	_, err = admin.CreateTopic(ctx, 3, 1, nil, flags.Topic)
	results["create_again_error"] = report.Code(err)

	if err := describeTopic(ctx, admin, flags.Topic, results); err != nil {
		return err
	}
	if err := describeConfigs(ctx, admin, flags.Topic, results); err != nil {
		return err
	}
	deleted, err := admin.DeleteTopic(ctx, flags.Topic)
	results["delete_error"] = report.Code(err)
	if err != nil {
		return fmt.Errorf("delete topic: %w", err)
	}
	results["deleted"] = map[string]any{"topic": deleted.Topic, "topic_id": deleted.ID.String()}
	// kadm's listings come from the client's metadata cache: the broker is asked directly.
	request := kmsg.NewPtrMetadataRequest()
	requestTopic := kmsg.NewMetadataRequestTopic()
	requestTopic.Topic = kmsg.StringPtr(flags.Topic)
	request.Topics = append(request.Topics, requestTopic)
	answer, err := request.RequestWith(ctx, client)
	if err != nil {
		return fmt.Errorf("metadata after delete: %w", err)
	}
	gone := map[string]any{"topics": len(answer.Topics)}
	for _, topic := range answer.Topics {
		gone["error"] = report.Code(kerr.ErrorForCode(topic.ErrorCode))
		gone["partitions"] = len(topic.Partitions)
	}
	results["after_delete"] = gone
	return nil
}

func describeTopic(ctx context.Context, admin *kadm.Client, topic string, results map[string]any) error {
	listed, err := admin.ListTopics(ctx, topic)
	if err != nil {
		return fmt.Errorf("list topics: %w", err)
	}
	detail := listed[topic]
	partitions := []map[string]any{}
	for _, p := range detail.Partitions.Sorted() {
		partitions = append(partitions, map[string]any{"partition": p.Partition, "leader": p.Leader,
			"leader_epoch": p.LeaderEpoch, "replicas": p.Replicas, "isr": p.ISR, "error": report.Code(p.Err)})
	}
	results["describe"] = map[string]any{"error": report.Code(detail.Err), "topic_id": detail.ID.String(),
		"internal": detail.IsInternal, "partitions": partitions}
	brokers, err := admin.ListBrokers(ctx)
	if err != nil {
		return fmt.Errorf("list brokers: %w", err)
	}
	results["brokers"] = brokers.NodeIDs()
	return nil
}

func describeConfigs(ctx context.Context, admin *kadm.Client, topic string, results map[string]any) error {
	described, err := admin.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return fmt.Errorf("describe configs: %w", err)
	}
	config, err := described.On(topic, nil)
	if err != nil {
		return fmt.Errorf("describe configs of %s: %w", topic, err)
	}
	values := map[string]any{}
	for _, entry := range config.Configs {
		if entry.Key == "retention.ms" || entry.Key == "cleanup.policy" {
			values[entry.Key] = map[string]any{"value": entry.MaybeValue(), "source": entry.Source.String()}
		}
	}
	results["configs"] = values
	return nil
}
