"""Real clients and tools against the broker: Python, Java, Go, Kafka's tools and Streams, and the comparison with Apache Kafka."""
