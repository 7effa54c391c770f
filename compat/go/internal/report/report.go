// Package report is what the check programs share: the flags every one takes, the JSON answer
// they print, and Kafka's error names for the errors the clients return.
package report

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
)

// Scenario does one scenario's work and writes what the broker answered into results.
type Scenario func(ctx context.Context, flags Flags, results map[string]any) error

// Main reads the command line, runs the scenario it names within its deadline and prints the
// answer (Emit); `client` names the client library in it.
func Main(client string, scenarios map[string]Scenario) {
	names := make([]string, 0, len(scenarios))
	for name := range scenarios {
		names = append(names, name)
	}
	sort.Strings(names)
	flags := Parse(names)
	ctx, cancel := flags.Context()
	results := map[string]any{"scenario": flags.Scenario, "client": client}
	err := scenarios[flags.Scenario](ctx, flags, results)
	cancel()
	Emit(results, err)
}

// Flags are the settings common to every scenario.
type Flags struct {
	Bootstrap string
	Scenario  string
	Topic     string
	Records   int
	Members   int
	Timeout   time.Duration
}

// Parse reads the command line; it exits with a usage line when a required flag is missing.
func Parse(scenarios []string) Flags {
	var f Flags
	flag.StringVar(&f.Bootstrap, "bootstrap", "", "host:port of the broker")
	flag.StringVar(&f.Scenario, "scenario", "", fmt.Sprintf("one of %v", scenarios))
	flag.StringVar(&f.Topic, "topic", "", "name of the topic (and the prefix of other names) the scenario creates")
	flag.IntVar(&f.Records, "records", 100, "records the scenario produces")
	flag.IntVar(&f.Members, "members", 2, "members of the consumer group that reads them")
	flag.DurationVar(&f.Timeout, "timeout", 20*time.Second, "the whole scenario's deadline")
	flag.Parse()
	if f.Bootstrap == "" || f.Topic == "" || f.Records <= 0 || f.Members <= 0 || !known(f.Scenario, scenarios) {
		fmt.Fprintf(os.Stderr, "usage: %s -bootstrap HOST:PORT -topic NAME -scenario %v [-records N] [-members N]\n",
			os.Args[0], scenarios)
		os.Exit(2)
	}
	return f
}

func known(name string, names []string) bool {
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}

// Context is the scenario's deadline.
func (f Flags) Context() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), f.Timeout)
}

// Emit prints the scenario's answer as one JSON object on stdout: its results, and "error"
// (null when the scenario ran to its end).  The exit status is 1 when it did not.
func Emit(results map[string]any, err error) {
	results["error"] = nil
	if err != nil {
		results["error"] = err.Error()
	}
	out, marshalErr := json.Marshal(results)
	if marshalErr != nil {
		fmt.Fprintf(os.Stderr, "cannot encode the results: %v\n", marshalErr)
		os.Exit(1)
	}
	fmt.Println(string(out))
	if err != nil {
		os.Exit(1)
	}
}

// Code is Kafka's name of the error (e.g. TOPIC_ALREADY_EXISTS), "" for none, else its text.
func Code(err error) string {
	if err == nil {
		return ""
	}
	var kafkaErr *kerr.Error
	if errors.As(err, &kafkaErr) {
		return kafkaErr.Message
	}
	return err.Error()
}
