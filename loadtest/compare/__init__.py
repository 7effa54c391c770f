"""`make compare`: the same scenarios against this broker and Apache Kafka 4.4.0 on this
machine, with the same clients and settings, printed as ratios (ours / Kafka's) and saved as
JSON (reports/compare.json).  One module per group of scenarios, each a list of parts:

  throughput   produce, consume (Kafka's Java perf tools and confluent-kafka), latency;
  requests     apiversions, metadata (rrclient request rates);
  connections  accepts, connects (10,000 sequential), idle (memory per idle connection);
  limits       storm, burst, quotas, control (the KIPs' scenarios under the same limits);
  startup      start-up time and an empty broker's memory.

brokers starts either broker behind one face, rows joins what each gave into the scenario
records {name, unit, ours, kafka, ratio, better, notes}, java_perf runs and parses Kafka's perf
tools, table prints and saves, and __main__ is the runner (`python -m loadtest.compare`).  The
load generators and measurements are loadtest/bench's, imported.
"""
