package pybroker.compat;

import static pybroker.compat.Clients.get;
import static pybroker.compat.Clients.props;

import java.util.ArrayList;
import java.util.Collection;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.kafka.clients.admin.DescribeProducersResult.PartitionProducerState;
import org.apache.kafka.clients.admin.ListTransactionsOptions;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionListing;
import org.apache.kafka.clients.admin.TransactionState;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;

/** KafkaProducer scenarios: idempotence, and transactions (consume-transform-produce with
 *  sendOffsetsToTransaction, fencing), with what describeProducers and describeTransactions
 *  say about them. */
final class ProducerScenarios {
    private ProducerScenarios() {
    }

    /** 100 records to partition 0 and 50 to partition 1 from one idempotent producer: the
     *  offsets acknowledged, what reads back, and the producer state the broker keeps. */
    static void idempotent(Clients clients, Map<String, Object> facts) throws Exception {
        clients.createTopic("idem", 2, Map.of());
        TopicPartition p0 = new TopicPartition("idem", 0);
        TopicPartition p1 = new TopicPartition("idem", 1);
        try (KafkaProducer<String, String> producer = clients.producer(props(
                ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true", ProducerConfig.ACKS_CONFIG, "all",
                "max.in.flight.requests.per.connection", "5",
                ProducerConfig.BATCH_SIZE_CONFIG, "1024"))) {
            facts.put("offsets_p0", contiguousFromZero(Clients.send(producer, "idem", 0, "a", 100, -1)));
            facts.put("offsets_p1", contiguousFromZero(Clients.send(producer, "idem", 1, "b", 50, -1)));
        }
        try (KafkaConsumer<String, String> consumer = clients.consumer(new java.util.Properties())) {
            consumer.assign(List.of(p0, p1));
            consumer.seekToBeginning(List.of(p0, p1));
            List<ConsumerRecord<String, String>> records = Clients.poll(consumer, 150);
            facts.put("read", records.size());
            facts.put("distinct_values", new HashSet<>(Clients.values(records)).size());
            Map<TopicPartition, Long> ends = consumer.endOffsets(List.of(p0, p1));
            facts.put("end_offsets", List.of(ends.get(p0), ends.get(p1)));
        }
        Map<TopicPartition, PartitionProducerState> states =
                get(clients.admin().describeProducers(List.of(p0, p1)).all());
        List<Long> ids = new ArrayList<>();
        List<Integer> lastSequences = new ArrayList<>();
        List<Integer> producerCounts = new ArrayList<>();
        for (TopicPartition partition : List.of(p0, p1)) {
            List<ProducerState> active = states.get(partition).activeProducers();
            producerCounts.add(active.size());
            for (ProducerState state : active) {
                ids.add(state.producerId());
                lastSequences.add(state.lastSequence());
                facts.put("producer_epoch", state.producerEpoch());
                facts.put("open_transaction", state.currentTransactionStartOffset().isPresent());
            }
        }
        facts.put("producers_per_partition", producerCounts);
        facts.put("last_sequences", lastSequences);
        facts.put("one_producer_id", ids.size() == 2 && ids.get(0).equals(ids.get(1)) && ids.get(0) >= 0);
    }

    /** "contiguous from 0" when the offsets are 0, 1, 2...; else the offsets themselves. */
    static Object contiguousFromZero(List<Long> offsets) {
        for (int i = 0; i < offsets.size(); i++) {
            if (offsets.get(i) != i) {
                return offsets;
            }
        }
        return "contiguous from 0, " + offsets.size();
    }

    /** Ten records in; a read_committed consumer in a group reads them; a transactional
     *  producer writes the first five transformed with their offsets
     *  (sendOffsetsToTransaction) and commits, then the other five and aborts.  Facts: the
     *  group's committed offset, what read_committed and read_uncommitted consumers see, and
     *  what describeTransactions, listTransactions and describeProducers say during the open
     *  transaction and after. */
    static void consumeTransformProduce(Clients clients, Map<String, Object> facts) throws Exception {
        clients.createTopic("ctp-in", 1, Map.of());
        clients.createTopic("ctp-out", 1, Map.of());
        TopicPartition in = new TopicPartition("ctp-in", 0);
        TopicPartition out = new TopicPartition("ctp-out", 0);
        try (KafkaProducer<String, String> plain = clients.producer(new java.util.Properties())) {
            Clients.send(plain, "ctp-in", 0, "in", 10, -1);
        }
        try (KafkaConsumer<String, String> consumer = clients.consumer(props(
                ConsumerConfig.GROUP_ID_CONFIG, "ctp-group",
                ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed"));
             KafkaProducer<String, String> producer = clients.producer(props(
                ProducerConfig.TRANSACTIONAL_ID_CONFIG, "ctp-tx"))) {
            consumer.subscribe(List.of("ctp-in"));
            List<ConsumerRecord<String, String>> input = Clients.poll(consumer, 10);
            facts.put("consumed", input.size());
            producer.initTransactions();
            transform(producer, consumer, input.subList(0, 5));
            producer.commitTransaction();
            transform(producer, consumer, input.subList(5, 10));
            facts.put("ongoing", describeTransaction(clients, "ctp-tx"));
            facts.put("ongoing_listed", listed(clients, "ctp-tx", TransactionState.ONGOING));
            long producerId = get(clients.admin().describeTransactions(List.of("ctp-tx"))
                    .description("ctp-tx")).producerId();
            facts.put("listed_by_filters", List.of(
                    listedWith(clients, new ListTransactionsOptions().filterProducerIds(List.of(producerId))),
                    listedWith(clients, new ListTransactionsOptions().filterProducerIds(List.of(producerId + 1))),
                    listedWith(clients, new ListTransactionsOptions().filterOnDuration(0)),
                    listedWith(clients, new ListTransactionsOptions().filterOnDuration(3_600_000))));
            List<ProducerState> writers =
                    get(clients.admin().describeProducers(List.of(out)).partitionResult(out)).activeProducers();
            facts.put("ongoing_transaction_start_offsets",
                      writers.stream().map(w -> w.currentTransactionStartOffset().orElse(-1)).toList());
            facts.put("ongoing_last_stable_offset", readCommittedEnd(clients, out));
            producer.abortTransaction();
            OffsetAndMetadata committed = consumer.committed(Set.of(in)).get(in);
            facts.put("group_committed_offset", committed == null ? null : committed.offset());
        }
        facts.put("after_abort", describeTransaction(clients, "ctp-tx"));
        facts.put("after_abort_listed", listed(clients, "ctp-tx", TransactionState.COMPLETE_ABORT));
        facts.put("read_committed_values", readAll(clients, out, "read_committed"));
        facts.put("read_uncommitted_count", readAll(clients, out, "read_uncommitted").size());
        facts.put("last_stable_offset", readCommittedEnd(clients, out));
        facts.put("group_offset_listed", get(clients.admin().listConsumerGroupOffsets("ctp-group")
                .partitionsToOffsetAndMetadata()).get(in).offset());
    }

    private static void transform(KafkaProducer<String, String> producer,
                                  KafkaConsumer<String, String> consumer,
                                  List<ConsumerRecord<String, String>> records) throws Exception {
        producer.beginTransaction();
        for (ConsumerRecord<String, String> record : records) {
            producer.send(new ProducerRecord<>("ctp-out", 0, record.key(), record.value().toUpperCase()));
        }
        long next = records.get(records.size() - 1).offset() + 1;
        producer.sendOffsetsToTransaction(
                Map.of(new TopicPartition(records.get(0).topic(), records.get(0).partition()),
                       new OffsetAndMetadata(next)),
                consumer.groupMetadata());
        producer.flush();
    }

    private static Map<String, Object> describeTransaction(Clients clients, String id) throws Exception {
        TransactionDescription description =
                get(clients.admin().describeTransactions(List.of(id)).description(id));
        Map<String, Object> facts = new LinkedHashMap<>();
        facts.put("state", description.state().name());
        facts.put("producer_id_known", description.producerId() >= 0);
        facts.put("producer_epoch", (int) description.producerEpoch());
        facts.put("timeout_ms", description.transactionTimeoutMs());
        facts.put("partitions", description.topicPartitions().stream().map(TopicPartition::toString).sorted().toList());
        facts.put("started", description.transactionStartTimeMs().isPresent());
        return facts;
    }

    private static boolean listed(Clients clients, String id, TransactionState state) throws Exception {
        Collection<TransactionListing> listings = get(clients.admin().listTransactions(
                new ListTransactionsOptions().filterStates(List.of(state))).all());
        return listings.stream().anyMatch(l -> l.transactionalId().equals(id) && l.state() == state);
    }

    private static boolean listedWith(Clients clients, ListTransactionsOptions options) throws Exception {
        return get(clients.admin().listTransactions(options).all()).stream()
                .anyMatch(l -> l.transactionalId().equals("ctp-tx"));
    }

    private static long readCommittedEnd(Clients clients, TopicPartition partition) {
        try (KafkaConsumer<String, String> consumer = clients.consumer(props(
                ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed"))) {
            return consumer.endOffsets(List.of(partition)).get(partition);
        }
    }

    /** Every record of one partition an unnamed consumer at that isolation level reads, up
     *  to its end offset. */
    static List<String> readAll(Clients clients, TopicPartition partition, String isolation) {
        try (KafkaConsumer<String, String> consumer = clients.consumer(props(
                ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation))) {
            consumer.assign(List.of(partition));
            consumer.seekToBeginning(List.of(partition));
            long end = consumer.endOffsets(List.of(partition)).get(partition);
            List<String> values = new ArrayList<>();
            long deadline = System.nanoTime() + Clients.WAIT.toNanos();
            while (consumer.position(partition) < end && System.nanoTime() < deadline) {
                consumer.poll(java.time.Duration.ofMillis(100)).forEach(r -> values.add(r.value()));
            }
            return values;
        }
    }

    /** Records in every compression codec, with headers and a null value, read back; a
     *  record past the topic's max.message.bytes refused. */
    static void formats(Clients clients, Map<String, Object> facts) throws Exception {
        clients.createTopic("fmt", 1, Map.of());
        TopicPartition partition = new TopicPartition("fmt", 0);
        String text = "the quick brown fox jumps over the lazy dog ".repeat(20);
        List<String> sent = new ArrayList<>();
        for (String codec : List.of("none", "gzip", "snappy", "lz4", "zstd")) {
            try (KafkaProducer<String, String> producer = clients.producer(props(
                    ProducerConfig.COMPRESSION_TYPE_CONFIG, codec))) {
                for (int i = 0; i < 20; i++) {
                    sent.add(codec + "-" + i + "-" + text);
                    producer.send(new ProducerRecord<>("fmt", 0, "k", codec + "-" + i + "-" + text));
                }
                producer.flush();
            }
        }
        try (KafkaProducer<String, String> producer = clients.producer(new java.util.Properties())) {
            var headers = new org.apache.kafka.common.header.internals.RecordHeaders();
            headers.add("trace", "abc".getBytes(java.nio.charset.StandardCharsets.UTF_8));
            headers.add("empty", null);
            producer.send(new ProducerRecord<>("fmt", 0, null, (String) null, "with-headers", headers)).get();
            producer.send(new ProducerRecord<String, String>("fmt", 0, "tombstone", null)).get();
        }
        try (KafkaConsumer<String, String> consumer = clients.consumer(new java.util.Properties())) {
            consumer.assign(List.of(partition));
            consumer.seekToBeginning(List.of(partition));
            List<ConsumerRecord<String, String>> records = Clients.poll(consumer, 102);
            List<String> values = Clients.values(records);
            facts.put("read", records.size());
            facts.put("compressed_values_match", values.size() >= 100 && values.subList(0, 100).equals(sent));
            if (records.size() == 102) {
                ConsumerRecord<String, String> headed = records.get(100);
                List<Object> headerFacts = new ArrayList<>();
                headed.headers().forEach(h -> headerFacts.add(java.util.Arrays.asList(
                        h.key(), h.value() == null ? null : new String(h.value(), java.nio.charset.StandardCharsets.UTF_8))));
                facts.put("headers", headerFacts);
                facts.put("null_key", headed.key() == null);
                facts.put("tombstone", java.util.Arrays.asList(records.get(101).key(), records.get(101).value()));
            }
        }
        try (KafkaConsumer<String, String> consumer = clients.consumer(props(
                ConsumerConfig.MAX_PARTITION_FETCH_BYTES_CONFIG, "512",
                ConsumerConfig.FETCH_MAX_BYTES_CONFIG, "512"))) {
            // a batch larger than both limits still comes, one at a time
            consumer.assign(List.of(partition));
            consumer.seekToBeginning(List.of(partition));
            facts.put("read_in_small_fetches", Clients.poll(consumer, 102).size());
        }
        try (KafkaProducer<String, String> producer = clients.producer(props(ProducerConfig.ACKS_CONFIG, "0",
                ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "false"))) {
            facts.put("acks_0_offsets", Clients.send(producer, "fmt", 0, "fire", 5, -1));
        }
        try (KafkaConsumer<String, String> consumer = clients.consumer(new java.util.Properties())) {
            consumer.assign(List.of(partition));
            consumer.seek(partition, 102);
            facts.put("acks_0_read", Clients.values(Clients.poll(consumer, 5)));
        }
        clients.createTopic("isr", 1, Map.of("min.insync.replicas", "2"));
        try (KafkaProducer<String, String> producer = clients.producer(props(ProducerConfig.ACKS_CONFIG, "all",
                ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "1500", ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "1000",
                ProducerConfig.LINGER_MS_CONFIG, "0"))) {
            facts.put("acks_all_one_replica_of_two", Clients.errorOf(() ->
                    producer.send(new ProducerRecord<>("isr", 0, "k", "v")).get()));
        }
        try (KafkaProducer<String, String> producer = clients.producer(props(ProducerConfig.ACKS_CONFIG, "1",
                ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "false"))) {
            facts.put("acks_1_one_replica_of_two", producer.send(new ProducerRecord<>("isr", 0, "k", "v")).get().offset());
        }
        try (KafkaProducer<String, String> producer = clients.producer(props(
                ProducerConfig.MAX_REQUEST_SIZE_CONFIG, String.valueOf(3 << 20)))) {
            facts.put("too_large", Clients.errorOf(() -> producer.send(
                    new ProducerRecord<>("fmt", 0, "k", "x".repeat(2 << 20))).get()));
        }
    }

    /** A second producer with the same transactional id fences the first mid-transaction:
     *  the first's commit fails, the second's commits, read_committed sees only the second's. */
    static void fenced(Clients clients, Map<String, Object> facts) throws Exception {
        clients.createTopic("fence", 1, Map.of());
        TopicPartition partition = new TopicPartition("fence", 0);
        try (KafkaProducer<String, String> first = clients.producer(props(
                ProducerConfig.TRANSACTIONAL_ID_CONFIG, "fence-tx"));
             KafkaProducer<String, String> second = clients.producer(props(
                ProducerConfig.TRANSACTIONAL_ID_CONFIG, "fence-tx"))) {
            first.initTransactions();
            first.beginTransaction();
            first.send(new ProducerRecord<>("fence", 0, "k", "first")).get();
            second.initTransactions();
            facts.put("first_commit_error", Clients.errorOf(first::commitTransaction));
            second.beginTransaction();
            second.send(new ProducerRecord<>("fence", 0, "k", "second")).get();
            second.commitTransaction();
            facts.put("second_epoch", (int) get(clients.admin().describeTransactions(List.of("fence-tx"))
                    .description("fence-tx")).producerEpoch());
        }
        facts.put("read_committed_values", readAll(clients, partition, "read_committed"));
        facts.put("stale_generation", staleGeneration(clients));
        try (KafkaProducer<String, String> producer = clients.producer(props(
                ProducerConfig.TRANSACTIONAL_ID_CONFIG, "fence-tx-3"))) {
            producer.initTransactions();
            producer.beginTransaction();
            producer.send(new ProducerRecord<>("fence", 0, "k", "fenced-by-admin")).get();
            get(clients.admin().fenceProducers(List.of("fence-tx-3")).all());
            facts.put("admin_fenced_commit", Clients.errorOf(producer::commitTransaction));
        }
        facts.put("after_admin_fence", readAll(clients, partition, "read_committed"));
        facts.put("timeout_above_broker_max", Clients.errorOf(() -> {
            try (KafkaProducer<String, String> producer = clients.producer(props(
                    ProducerConfig.TRANSACTIONAL_ID_CONFIG, "fence-tx-4",
                    ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "3600000"))) {
                producer.initTransactions();
            }
        }));
        timedOut(clients, facts);
    }

    /** A transaction open past its timeout (1 s) is aborted by the coordinator, which looks
     *  every transaction.abort.timed.out.transaction.cleanup.interval.ms (the run's broker: 500). */
    private static void timedOut(Clients clients, Map<String, Object> facts) throws Exception {
        try (KafkaProducer<String, String> producer = clients.producer(props(
                ProducerConfig.TRANSACTIONAL_ID_CONFIG, "fence-tx-5",
                ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "1000"))) {
            producer.initTransactions();
            producer.beginTransaction();
            producer.send(new ProducerRecord<>("fence", 0, "k", "timed-out")).get();
            Map<String, Object> state = Clients.settled(() -> Map.of("state", get(clients.admin()
                    .describeTransactions(List.of("fence-tx-5")).description("fence-tx-5")).state().name()),
                    found -> found.get("state").equals("COMPLETE_ABORT"));
            facts.put("timed_out_state", state.get("state"));
            facts.put("timed_out_commit", Clients.errorOf(producer::commitTransaction));
        }
        facts.put("after_time_out", readAll(clients, new TopicPartition("fence", 0), "read_committed"));
    }

    /** sendOffsetsToTransaction with a generation the group never had: the commit's error. */
    private static String staleGeneration(Clients clients) throws Exception {
        try (KafkaConsumer<String, String> consumer = clients.consumer(props(
                ConsumerConfig.GROUP_ID_CONFIG, "fence-group"));
             KafkaProducer<String, String> producer = clients.producer(props(
                ProducerConfig.TRANSACTIONAL_ID_CONFIG, "fence-tx-2"))) {
            consumer.subscribe(List.of("fence"));
            Clients.poll(consumer, 1);
            var current = consumer.groupMetadata();
            producer.initTransactions();
            producer.beginTransaction();
            producer.send(new ProducerRecord<>("fence", 0, "k", "stale")).get();
            var stale = new org.apache.kafka.clients.consumer.ConsumerGroupMetadata(current.groupId(),
                    current.generationId() + 5, current.memberId(), current.groupInstanceId());
            String error = Clients.errorOf(() -> {
                producer.sendOffsetsToTransaction(Map.of(new TopicPartition("fence", 0), new OffsetAndMetadata(1)), stale);
                producer.commitTransaction();
            });
            Clients.errorOf(producer::abortTransaction);
            return error;
        }
    }
}
