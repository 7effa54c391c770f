package pybroker.compat;

import java.time.Duration;
import java.util.Arrays;
import java.util.Locale;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import sun.misc.Signal;

/** A Kafka Streams word count with exactly-once (v2) processing: lines of an input topic are
 *  split into words, regrouped by word through a repartition topic, counted in a state store
 *  backed by a compacted changelog topic, and each word's count written to an output topic.
 *
 *  <p>Arguments: bootstrap servers, application id, input topic, output topic, state
 *  directory, then any number of {@code key=value} Streams settings that override the
 *  defaults below (settings suited to one broker that a test kills and restarts).
 *
 *  <p>Prints {@code STATE <old> -> <new>} at each state change (so {@code STATE ... ->
 *  RUNNING} once it processes), {@code THREAD-ERROR <exception>} when an exception Streams
 *  does not handle itself ends a stream thread (the client then shuts down: {@code -> ERROR}),
 *  and {@code CLOSED} once SIGTERM closed it cleanly (exit status 0). */
public final class WordCount {
    static final String STORE = "counts";
    static final String REGROUP = "words";

    public static void main(String[] args) throws Exception {
        if (args.length < 5) {
            System.err.println("usage: WordCount <bootstrap> <application.id> <input> <output>"
                    + " <state.dir> [key=value ...]");
            System.exit(2);
        }
        Properties props = settings(args[0], args[1], args[4]);
        for (int i = 5; i < args.length; i++) {
            String[] pair = args[i].split("=", 2);
            props.put(pair[0], pair[1]);
        }
        KafkaStreams streams = new KafkaStreams(topology(args[2], args[3]).build(), props);
        streams.setStateListener((next, previous) ->
                System.out.println("STATE " + previous + " -> " + next));
        streams.setUncaughtExceptionHandler(exception -> {
            System.out.println("THREAD-ERROR " + exception);
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        CountDownLatch terminated = new CountDownLatch(1);
        Signal.handle(new Signal("TERM"), signal -> terminated.countDown());
        streams.start();
        terminated.await();
        boolean closed = streams.close(Duration.ofSeconds(20));
        System.out.println(closed ? "CLOSED" : "CLOSE-TIMED-OUT");
        System.out.flush();
        System.exit(closed ? 0 : 1);
    }

    static StreamsBuilder topology(String input, String output) {
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
                .flatMapValues(line -> Arrays.asList(line.toLowerCase(Locale.ROOT).split("\\W+")))
                .filter((key, word) -> !word.isEmpty())
                .groupBy((key, word) -> word, Grouped.with(REGROUP, Serdes.String(), Serdes.String()))
                .count(Materialized.as(STORE))
                .toStream()
                .to(output, Produced.with(Serdes.String(), Serdes.Long()));
        return builder;
    }

    /** Exactly-once v2 on one broker: one replica, commits every 100 ms, sessions short
     *  enough that a restarted instance replaces its dead self within seconds, and a
     *  transaction timeout long enough that a slow restart of the broker (seconds on a loaded
     *  machine) does not abort the open transaction (it would fence the producer). */
    static Properties settings(String bootstrap, String applicationId, String stateDir) {
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        props.put(StreamsConfig.GROUP_PROTOCOL_CONFIG, "classic");
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 6000);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), 500);
        props.put(StreamsConfig.producerPrefix(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG), 60000);
        props.put(StreamsConfig.RECONNECT_BACKOFF_MAX_MS_CONFIG, 500);
        props.put(StreamsConfig.RETRY_BACKOFF_MS_CONFIG, 100);
        return props;
    }
}
