// Command franzcheck drives this broker with franz-go (kgo, kadm) through one scenario and
// prints what the broker answered as one JSON object, for tests/compat/test_go_clients.py to assert on.
//
//	franzcheck -bootstrap 127.0.0.1:9092 -topic t1 -scenario admin|group|txn|eos [-records N]
package main

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"pybroker/compat/go/internal/report"
)

// topicPartitions is the number of partitions of every topic a scenario creates.
const topicPartitions = 3

func main() {
	report.Main("franz-go", map[string]report.Scenario{
		"admin": adminScenario,
		"group": groupScenario,
		"txn":   txnScenario,
		"eos":   eosScenario,
	})
}

// newClient is a kgo client of the broker with the scenario's own options.
func newClient(flags report.Flags, opts ...kgo.Opt) (*kgo.Client, error) {
	all := append([]kgo.Opt{kgo.SeedBrokers(flags.Bootstrap), kgo.ClientID("franzcheck")}, opts...)
	return kgo.NewClient(all...)
}

// withTopics is a kgo client with the scenario's options and a kadm client on it, once the
// topics exist (topicPartitions partitions each); the caller closes the kgo client.
func withTopics(ctx context.Context, flags report.Flags, topics []string, opts ...kgo.Opt) (*kgo.Client, *kadm.Client, error) {
	client, err := newClient(flags, opts...)
	if err != nil {
		return nil, nil, err
	}
	admin := kadm.NewClient(client)
	for _, topic := range topics {
		if err := createTopic(ctx, admin, topic, topicPartitions); err != nil {
			client.Close()
			return nil, nil, err
		}
	}
	return client, admin, nil
}

// createTopic makes a topic of `partitions` partitions and one replica with kadm.
func createTopic(ctx context.Context, admin *kadm.Client, topic string, partitions int32) error {
	created, err := admin.CreateTopic(ctx, partitions, 1, nil, topic)
	if err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	if created.NumPartitions != partitions {
		return fmt.Errorf("create topic %s: %d partitions, asked %d", topic, created.NumPartitions, partitions)
	}
	return nil
}

// offsetsOf is {"partition": offset} of one topic's listed offsets.
func offsetsOf(listed kadm.ListedOffsets, topic string) (map[string]int64, error) {
	found := map[string]int64{}
	for partition, offset := range listed[topic] {
		if offset.Err != nil {
			return nil, fmt.Errorf("offset of %s[%d]: %w", topic, partition, offset.Err)
		}
		found[fmt.Sprint(partition)] = offset.Offset
	}
	return found, nil
}

// committedOf is {"partition": committed offset} of one group's topic.
func committedOf(fetched kadm.OffsetResponses, topic string) (map[string]int64, error) {
	found := map[string]int64{}
	for partition, offset := range fetched[topic] {
		if offset.Err != nil {
			return nil, fmt.Errorf("committed offset of %s[%d]: %w", topic, partition, offset.Err)
		}
		found[fmt.Sprint(partition)] = offset.At
	}
	return found, nil
}

// endOffsets is {"partition": end offset} of a topic (ListOffsets latest).
func endOffsets(ctx context.Context, admin *kadm.Client, topic string) (map[string]int64, error) {
	listed, err := admin.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("list end offsets: %w", err)
	}
	return offsetsOf(listed, topic)
}

// committedOffsets is {"partition": offset} that a group committed for a topic (OffsetFetch).
func committedOffsets(ctx context.Context, admin *kadm.Client, group, topic string) (map[string]int64, error) {
	fetched, err := admin.FetchOffsets(ctx, group)
	if err != nil {
		return nil, fmt.Errorf("fetch offsets: %w", err)
	}
	return committedOf(fetched, topic)
}
