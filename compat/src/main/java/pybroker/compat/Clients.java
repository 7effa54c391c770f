package pybroker.compat;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/** The clients one run of ClientsCheck makes against one broker: the bootstrap address and
 *  the settings every client gets, factories for Admin, producers and consumers with short
 *  timeouts, and the steps scenarios share (create a topic, poll for n records, name an
 *  error). */
final class Clients {
    static final Duration WAIT = Duration.ofSeconds(20);

    final String bootstrap;
    final Properties common;
    private Admin admin;

    Clients(String bootstrap, Properties common) {
        if (bootstrap.isEmpty()) {
            throw new IllegalArgumentException("no bootstrap address");
        }
        this.bootstrap = bootstrap;
        this.common = common;
    }

    static Properties props(Object... pairs) {
        Properties props = new Properties();
        for (int i = 0; i + 1 < pairs.length; i += 2) {
            props.put(String.valueOf(pairs[i]), String.valueOf(pairs[i + 1]));
        }
        return props;
    }

    /** A client's settings: the address and timeouts, its kind's `defaults`, the run's
     *  common settings, then the caller's `extra`. */
    private Properties configured(Properties defaults, Properties extra) {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        props.putAll(defaults);
        props.putAll(common);
        props.putAll(extra);
        return props;
    }

    private static final Properties ADMIN = props(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "20000");

    private static final Properties PRODUCER = props(
            ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName(),
            ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName(),
            ProducerConfig.MAX_BLOCK_MS_CONFIG, "20000",
            ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "20000",
            ProducerConfig.LINGER_MS_CONFIG, "5");

    private static final Properties CONSUMER = props(
            ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName(),
            ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName(),
            ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "20000",
            ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest",
            ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false",
            ConsumerConfig.GROUP_PROTOCOL_CONFIG, "classic",
            ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "10000",
            ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "500",
            // a seek waits for the fetch in flight: keep that wait short
            ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "50");

    /** The run's shared Admin, with the common settings. */
    Admin admin() {
        if (admin == null) {
            admin = newAdmin(new Properties());
        }
        return admin;
    }

    Admin newAdmin(Properties extra) {
        return Admin.create(configured(ADMIN, extra));
    }

    KafkaProducer<String, String> producer(Properties extra) {
        return new KafkaProducer<>(configured(PRODUCER, extra));
    }

    /** A share consumer (KIP-932) of `group`: the run's common settings, String values. */
    org.apache.kafka.clients.consumer.KafkaShareConsumer<String, String> shareConsumer(String group) {
        Properties settings = configured(props(
                ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName(),
                ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName(),
                ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "20000"),
                props(ConsumerConfig.GROUP_ID_CONFIG, group));
        return new org.apache.kafka.clients.consumer.KafkaShareConsumer<>(settings);
    }

    KafkaConsumer<String, String> consumer(Properties extra) {
        Properties settings = configured(CONSUMER, extra);
        if ("consumer".equals(settings.get(ConsumerConfig.GROUP_PROTOCOL_CONFIG))) {
            // the broker sets a member's session and heartbeats in that protocol (KIP-848)
            settings.remove(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG);
            settings.remove(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG);
        }
        return new KafkaConsumer<>(settings);
    }

    void createTopic(String name, int partitions, Map<String, String> configs) throws Exception {
        NewTopic topic = new NewTopic(name, Optional.of(partitions), Optional.empty());
        topic.configs(configs);
        admin().createTopics(List.of(topic)).all().get(WAIT.toMillis(), TimeUnit.MILLISECONDS);
    }

    /** A new topic with `perPartition` records "p<partition>-i" in each partition. */
    void createAndFill(String topic, int partitions, int perPartition) throws Exception {
        createTopic(topic, partitions, Map.of());
        try (KafkaProducer<String, String> producer = producer(new Properties())) {
            for (int partition = 0; partition < partitions; partition++) {
                send(producer, topic, partition, "p" + partition, perPartition, -1);
            }
        }
    }

    /** Sends `count` records "<prefix>-i" to one partition, timestamps `firstTimestamp + i`
     *  (or the producer's clock when negative); returns the acknowledged offsets. */
    static List<Long> send(KafkaProducer<String, String> producer, String topic, int partition,
                           String prefix, int count, long firstTimestamp) throws Exception {
        List<java.util.concurrent.Future<RecordMetadata>> sent = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            Long timestamp = firstTimestamp < 0 ? null : firstTimestamp + i;
            sent.add(producer.send(new ProducerRecord<>(topic, partition, timestamp,
                                                        prefix + "-key-" + i, prefix + "-" + i)));
        }
        producer.flush();
        List<Long> offsets = new ArrayList<>();
        for (var future : sent) {
            offsets.add(future.get(WAIT.toMillis(), TimeUnit.MILLISECONDS).offset());
        }
        return offsets;
    }

    /** Polls until `count` records came or the wait is over: what came. */
    static List<ConsumerRecord<String, String>> poll(KafkaConsumer<String, String> consumer,
                                                    int count) {
        List<ConsumerRecord<String, String>> records = new ArrayList<>();
        long deadline = System.nanoTime() + WAIT.toNanos();
        while (records.size() < count && System.nanoTime() < deadline) {
            consumer.poll(Duration.ofMillis(100)).forEach(records::add);
        }
        return records;
    }

    static List<String> values(Collection<ConsumerRecord<String, String>> records) {
        List<String> values = new ArrayList<>();
        records.forEach(record -> values.add(record.value()));
        return values;
    }

    /** A description of something a step changed. */
    interface Describe {
        Map<String, Object> get() throws Exception;
    }

    /** What `describe` answers once `done` holds of it (or at the deadline): Kafka applies
     *  config, quota and credential changes to its metadata image a moment after answering. */
    static Map<String, Object> settled(Describe describe,
                                       java.util.function.Predicate<Map<String, Object>> done)
            throws Exception {
        long deadline = System.nanoTime() + WAIT.toNanos();
        Map<String, Object> found = describe.get();
        while (!done.test(found) && System.nanoTime() < deadline) {
            Thread.sleep(20);
            found = describe.get();
        }
        return found;
    }

    /** A step expected to fail: the simple name of the exception it threw, or "none". */
    interface Step {
        void run() throws Exception;
    }

    static String errorOf(Step step) {
        try {
            step.run();
            return "none";
        } catch (Throwable error) {
            return ClientsCheck.unwrap(error).getClass().getSimpleName();
        }
    }

    static String describe(Throwable error) {
        StringBuilder text = new StringBuilder(error.getClass().getName());
        if (error.getMessage() != null) {
            text.append(": ").append(error.getMessage());
        }
        StackTraceElement[] stack = error.getStackTrace();
        for (int i = 0; i < Math.min(stack.length, 6); i++) {
            text.append("\n  at ").append(stack[i]);
        }
        return text.toString();
    }

    static <T> T get(org.apache.kafka.common.KafkaFuture<T> future) throws Exception {
        try {
            return future.get(WAIT.toMillis(), TimeUnit.MILLISECONDS);
        } catch (ExecutionException error) {
            throw error.getCause() instanceof Exception cause ? cause : error;
        }
    }
}
