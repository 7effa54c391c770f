"""Front-end mode: this network layer before an upstream Kafka cluster."""
