// Command franzcheck drives this broker with franz-go (kgo, kadm) through one scenario and
// prints what the broker answered as one JSON object, for tests/test_go_clients.py to assert on.
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

var scenarios = map[string]func(context.Context, report.Flags, map[string]any) error{
	"admin": adminScenario,
	"group": groupScenario,
	"txn":   txnScenario,
	"eos":   eosScenario,
}

func main() {
	names := make([]string, 0, len(scenarios))
	for name := range scenarios {
		names = append(names, name)
	}
	flags := report.Parse(names)
	ctx, cancel := flags.Context()
	defer cancel()
	results := map[string]any{"scenario": flags.Scenario, "client": "franz-go"}
	report.Emit(results, scenarios[flags.Scenario](ctx, flags, results))
}

// newClient is a kgo client of the broker with the scenario's own options.
func newClient(flags report.Flags, opts ...kgo.Opt) (*kgo.Client, error) {
	all := append([]kgo.Opt{kgo.SeedBrokers(flags.Bootstrap), kgo.ClientID("franzcheck")}, opts...)
	return kgo.NewClient(all...)
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
