// Command saramacheck drives this broker with Sarama (IBM/sarama) through one scenario and
// prints what the broker answered as one JSON object, for tests/compat/test_go_clients.py to assert on.
//
//	saramacheck -bootstrap 127.0.0.1:9092 -topic t1 -scenario group [-records N] [-version 2.8.0]
//
// -version is the Kafka version Sarama speaks (its protocol versions follow it): "default"
// (Sarama's own, 2.8), "max" (the newest it knows) or a version such as 3.6.0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/IBM/sarama"

	"pybroker/compat/go/internal/report"
)

var debug = flag.Bool("debug", false, "Sarama's log on stderr")

var kafkaVersion = flag.String("version", "max", `Kafka version Sarama speaks: "default", "max" or e.g. 3.6.0`)

func main() {
	report.Main("sarama", map[string]report.Scenario{"group": withConfig(groupScenario)})
}

// withConfig runs a scenario with the Sarama configuration the flags ask for.
func withConfig(run func(context.Context, report.Flags, *sarama.Config, map[string]any) error) report.Scenario {
	return func(ctx context.Context, flags report.Flags, results map[string]any) error {
		if *debug {
			sarama.Logger = log.New(os.Stderr, "[sarama] ", log.Lmicroseconds)
		}
		config, err := newConfig(*kafkaVersion)
		if err != nil {
			return err
		}
		results["version"] = config.Version.String()
		return run(ctx, flags, config, results)
	}
}

// newConfig: acks=all, idempotent (one request in flight, as Sarama requires), successes
// returned, offsets committed by hand, consumption from the oldest offset.
func newConfig(version string) (*sarama.Config, error) {
	config := sarama.NewConfig()
	config.ClientID = "saramacheck"
	switch version {
	case "default":
	case "max":
		config.Version = sarama.MaxVersion
	default:
		parsed, err := sarama.ParseKafkaVersion(version)
		if err != nil {
			return nil, err
		}
		config.Version = parsed
	}
	config.Producer.RequiredAcks = sarama.WaitForAll
	config.Producer.Idempotent = true
	config.Net.MaxOpenRequests = 1
	config.Producer.Return.Successes = true
	config.Consumer.Offsets.Initial = sarama.OffsetOldest
	config.Consumer.Offsets.AutoCommit.Enable = false
	config.Consumer.Return.Errors = true
	config.Consumer.Group.Heartbeat.Interval = 200 * time.Millisecond
	// Members that join an empty group together often meet a SyncGroup answered
	// REBALANCE_IN_PROGRESS (the second join restarts the round, as in Kafka); Sarama then
	// waits this long before it joins again (2 s by default).
	config.Consumer.Group.Rebalance.Retry.Backoff = 100 * time.Millisecond
	// A member gives its partitions up only once its fetch in flight is answered.
	config.Consumer.MaxWaitTime = 100 * time.Millisecond
	return config, config.Validate()
}

// code is Kafka's number of the error Sarama returned (0 for none, -2 for one that is not
// Kafka's).
func code(err error) int {
	if err == nil {
		return 0
	}
	var kafkaErr sarama.KError
	if errors.As(err, &kafkaErr) {
		return int(kafkaErr)
	}
	var produceErrs sarama.ProducerErrors
	if errors.As(err, &produceErrs) && len(produceErrs) > 0 {
		return code(produceErrs[0].Err)
	}
	return -2
}

func errorText(err error) string {
	if err == nil {
		return ""
	}
	return fmt.Sprint(err)
}
