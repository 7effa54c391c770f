package pybroker.compat;

import static pybroker.compat.Clients.props;

import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.kafka.clients.admin.ListOffsetsOptions;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.TopicPartition;

/** KafkaConsumer scenarios: a group that consumes, commits and resumes from its commit;
 *  positions (seek, seekToBeginning/End, offsetsForTimes, beginning and end offsets); two
 *  members sharing partitions through rebalances, with the classic group protocol and with
 *  the consumer group protocol (KIP-848). */
final class ConsumerScenarios {
    static final long BASE_TIME = 1_700_000_000_000L;

    private ConsumerScenarios() {
    }

    /** Ten records in each of two partitions; a member of "cg-group" reads all, commits;
     *  a new member of the group reads only the two records produced after the commit. */
    static void group(Clients clients, Map<String, Object> facts) throws Exception {
        clients.createAndFill("cg", 2, 10);
        TopicPartition p0 = new TopicPartition("cg", 0);
        TopicPartition p1 = new TopicPartition("cg", 1);
        java.util.Properties member = props(ConsumerConfig.GROUP_ID_CONFIG, "cg-group");
        try (KafkaConsumer<String, String> consumer = clients.consumer(member)) {
            consumer.subscribe(List.of("cg"));
            List<ConsumerRecord<String, String>> records = Clients.poll(consumer, 20);
            facts.put("consumed", records.size());
            facts.put("assignment", consumer.assignment().stream().map(TopicPartition::toString).sorted().toList());
            facts.put("generation_positive", consumer.groupMetadata().generationId() > 0);
            facts.put("partitions_for", consumer.partitionsFor("cg").size());
            facts.put("topic_listed", consumer.listTopics().containsKey("cg"));
            consumer.commitSync();
            Map<TopicPartition, OffsetAndMetadata> committed = consumer.committed(Set.of(p0, p1));
            facts.put("committed", List.of(committed.get(p0).offset(), committed.get(p1).offset()));
        }
        try (KafkaProducer<String, String> producer = clients.producer(new java.util.Properties())) {
            Clients.send(producer, "cg", 0, "late", 2, -1);
        }
        try (KafkaConsumer<String, String> consumer = clients.consumer(member)) {
            consumer.subscribe(List.of("cg"));
            List<ConsumerRecord<String, String>> records = Clients.poll(consumer, 2);
            // a moment more: anything past the two would be a record read twice
            consumer.poll(Duration.ofMillis(300)).forEach(records::add);
            facts.put("resumed_values", Clients.values(records));
            facts.put("resumed_offsets", records.stream().map(ConsumerRecord::offset).toList());
        }
    }

    /** Ten records with timestamps BASE_TIME + 1000 i in one partition, read by position. */
    static void positions(Clients clients, Map<String, Object> facts) throws Exception {
        clients.createTopic("pos", 1, Map.of());
        TopicPartition partition = new TopicPartition("pos", 0);
        try (KafkaProducer<String, String> producer = clients.producer(new java.util.Properties())) {
            for (int i = 0; i < 10; i++) {
                Clients.send(producer, "pos", 0, "r" + i, 1, BASE_TIME + 1000L * i);
            }
        }
        try (KafkaConsumer<String, String> consumer = clients.consumer(new java.util.Properties())) {
            List<TopicPartition> only = List.of(partition);
            consumer.assign(only);
            facts.put("beginning", consumer.beginningOffsets(only).get(partition));
            facts.put("end", consumer.endOffsets(only).get(partition));
            consumer.seek(partition, 7);
            facts.put("after_seek_7", firstOffset(consumer));
            consumer.seekToBeginning(only);
            facts.put("after_seek_to_beginning", firstOffset(consumer));
            consumer.seekToEnd(only);
            facts.put("after_seek_to_end", consumer.position(partition));
            Map<String, Object> byTime = new LinkedHashMap<>();
            for (long time : new long[] {0, BASE_TIME + 3500, BASE_TIME + 9000, BASE_TIME + 9001}) {
                OffsetAndTimestamp found = consumer.offsetsForTimes(Map.of(partition, time)).get(partition);
                byTime.put(String.valueOf(time - BASE_TIME),
                           found == null ? null : List.of(found.offset(), found.timestamp() - BASE_TIME));
            }
            facts.put("offsets_for_times", byTime);
            consumer.seek(partition, 3);
            ConsumerRecord<String, String> record = Clients.poll(consumer, 1).get(0);
            facts.put("record_3", List.of(record.value(), record.timestamp() - BASE_TIME,
                                          record.timestampType().name));
        }
        Map<String, Object> listed = new LinkedHashMap<>();
        Map<String, OffsetSpec> specs = new LinkedHashMap<>();
        specs.put("earliest", OffsetSpec.earliest());
        specs.put("latest", OffsetSpec.latest());
        specs.put("max_timestamp", OffsetSpec.maxTimestamp());
        specs.put("for_timestamp_3500", OffsetSpec.forTimestamp(BASE_TIME + 3500));
        specs.put("earliest_local", OffsetSpec.earliestLocal());
        specs.put("latest_tiered", OffsetSpec.latestTiered());
        specs.put("earliest_pending_upload", OffsetSpec.earliestPendingUpload());
        for (Map.Entry<String, OffsetSpec> spec : specs.entrySet()) {
            listed.put(spec.getKey(), listOffset(clients, partition, spec.getValue()));
        }
        facts.put("admin_list_offsets", listed);
    }

    /** [offset, timestamp - BASE_TIME (or -1)] of one admin listOffsets, or its error. */
    private static Object listOffset(Clients clients, TopicPartition partition, OffsetSpec spec) {
        try {
            var info = Clients.get(clients.admin().listOffsets(Map.of(partition, spec),
                    new ListOffsetsOptions(IsolationLevel.READ_COMMITTED)).partitionResult(partition));
            return List.of(info.offset(), info.timestamp() < 0 ? -1 : info.timestamp() - BASE_TIME);
        } catch (Exception error) {
            return ClientsCheck.unwrap(error).getClass().getSimpleName();
        }
    }

    /** A static member (group.instance.id) of "static-group": replaced by a new consumer
     *  with the same instance id without a rebalance, which fences the one it replaced. */
    static void staticMembership(Clients clients, Map<String, Object> facts) throws Exception {
        clients.createTopic("static", 2, Map.of());
        java.util.Properties member = props(ConsumerConfig.GROUP_ID_CONFIG, "static-group",
                ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, "static-1");
        int generation;
        String firstMember;
        try (KafkaConsumer<String, String> first = clients.consumer(member)) {
            first.subscribe(List.of("static"));
            pollUntil(List.of(first), c -> c.get(0).assignment().size() == 2);
            generation = first.groupMetadata().generationId();
            firstMember = first.groupMetadata().memberId();
            var described = Clients.get(clients.admin().describeConsumerGroups(List.of("static-group")).all())
                    .get("static-group");
            facts.put("described_instances", described.members().stream()
                    .map(m -> m.groupInstanceId().orElse("")).toList());
        }
        KafkaConsumer<String, String> second = clients.consumer(member);
        second.subscribe(List.of("static"));
        pollUntil(List.of(second), c -> c.get(0).assignment().size() == 2);
        facts.put("same_generation_after_restart", second.groupMetadata().generationId() == generation);
        facts.put("new_member_id", !second.groupMetadata().memberId().equals(firstMember));
        try (KafkaConsumer<String, String> third = clients.consumer(member)) {
            third.subscribe(List.of("static"));
            pollUntil(List.of(third), c -> c.get(0).assignment().size() == 2);
            facts.put("third_assigned", third.assignment().size());
            facts.put("replaced_one_commits", Clients.errorOf(() -> second.commitSync(
                    Map.of(new TopicPartition("static", 0), new OffsetAndMetadata(0)))));
        }
        facts.put("replaced_one_polls", Clients.errorOf(() -> second.poll(Duration.ofMillis(500))));
        Clients.errorOf(second::close);
    }

    private static long firstOffset(KafkaConsumer<String, String> consumer) {
        List<ConsumerRecord<String, String>> records = Clients.poll(consumer, 1);
        return records.isEmpty() ? -1 : records.get(0).offset();
    }

    /** Two members of "rb-group" on a two-partition topic: one partition each; after one
     *  leaves, the other holds both. */
    static void rebalance(Clients clients, Map<String, Object> facts) throws Exception {
        clients.createTopic("rb", 2, Map.of());
        Map<String, Object> eager = new LinkedHashMap<>();
        rebalance(clients, eager, props(ConsumerConfig.GROUP_ID_CONFIG, "rb-range"));
        facts.put("range", eager);
        Map<String, Object> cooperative = new LinkedHashMap<>();
        rebalance(clients, cooperative, props(ConsumerConfig.GROUP_ID_CONFIG, "rb-cooperative",
                ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG,
                org.apache.kafka.clients.consumer.CooperativeStickyAssignor.class.getName()));
        facts.put("cooperative", cooperative);
    }

    private static void rebalance(Clients clients, Map<String, Object> facts, java.util.Properties member)
            throws Exception {
        KafkaConsumer<String, String> first = clients.consumer(member);
        try (KafkaConsumer<String, String> second = clients.consumer(member)) {
            first.subscribe(List.of("rb"));
            pollUntil(List.of(first), c -> c.get(0).assignment().size() == 2);
            facts.put("alone", first.assignment().size());
            second.subscribe(List.of("rb"));
            boolean split = pollUntil(List.of(first, second),
                    c -> c.get(0).assignment().size() == 1 && c.get(1).assignment().size() == 1);
            facts.put("shared", List.of(first.assignment().size(), second.assignment().size()));
            facts.put("split", split);
            facts.put("same_generation", first.groupMetadata().generationId()
                      == second.groupMetadata().generationId());
            first.close();
            pollUntil(List.of(second), c -> c.get(0).assignment().size() == 2);
            facts.put("after_leave", second.assignment().size());
        }
    }

    /** The consumer group protocol (KIP-848, group.protocol=consumer): a member alone reads
     *  both partitions and commits; a second member joins and they split them, never both
     *  holding one; the Admin describes the group as a consumer group; after the first leaves,
     *  the second holds both and sees the first's commits. */
    static void modernGroup(Clients clients, Map<String, Object> facts) throws Exception {
        clients.createAndFill("mg", 2, 10);
        TopicPartition p0 = new TopicPartition("mg", 0);
        TopicPartition p1 = new TopicPartition("mg", 1);
        java.util.Properties member = props(ConsumerConfig.GROUP_ID_CONFIG, "mg-group",
                ConsumerConfig.GROUP_PROTOCOL_CONFIG, "consumer");
        KafkaConsumer<String, String> first = clients.consumer(member);
        try (KafkaConsumer<String, String> second = clients.consumer(member)) {
            first.subscribe(List.of("mg"));
            facts.put("consumed", Clients.poll(first, 20).size());
            facts.put("alone", first.assignment().size());
            facts.put("epoch_positive", first.groupMetadata().generationId() > 0);
            first.commitSync();
            second.subscribe(List.of("mg"));
            facts.put("split", pollUntil(List.of(first, second),
                    c -> c.get(0).assignment().size() == 1 && c.get(1).assignment().size() == 1));
            facts.put("disjoint", java.util.Collections.disjoint(first.assignment(), second.assignment()));
            var described = Clients.get(clients.admin().describeConsumerGroups(List.of("mg-group")).all())
                    .get("mg-group");
            facts.put("described", List.of(described.type().name(), described.members().size(),
                    described.partitionAssignor()));
            facts.put("listed_type", Clients.get(clients.admin().listGroups(
                    org.apache.kafka.clients.admin.ListGroupsOptions.forConsumerGroups()).all()).stream()
                    .filter(g -> g.groupId().equals("mg-group"))
                    .map(g -> g.type().map(Enum::name).orElse("?")).toList());
            first.close();
            facts.put("after_leave", pollUntil(List.of(second), c -> c.get(0).assignment().size() == 2));
            Map<TopicPartition, OffsetAndMetadata> committed = second.committed(Set.of(p0, p1));
            facts.put("committed", List.of(committed.get(p0).offset(), committed.get(p1).offset()));
        }
    }

    /** A share group (KIP-932): its start moved to the beginning by the Admin, two
     *  KafkaShareConsumers read the ten records of one partition between them, each record
     *  once; the Admin describes the group; a later member gets none of them again. */
    static void shareGroup(Clients clients, Map<String, Object> facts) throws Exception {
        clients.createAndFill("sh", 1, 10);
        TopicPartition p0 = new TopicPartition("sh", 0);
        Clients.get(clients.admin().alterShareGroupOffsets("sh-group", Map.of(p0, 0L)).all());
        List<String> seen = new java.util.ArrayList<>();
        try (var first = clients.shareConsumer("sh-group");
             var second = clients.shareConsumer("sh-group")) {
            first.subscribe(List.of("sh"));
            second.subscribe(List.of("sh"));
            long deadline = System.nanoTime() + Clients.WAIT.toNanos();
            while (seen.size() < 10 && System.nanoTime() < deadline) {
                for (var consumer : List.of(first, second)) {
                    consumer.poll(Duration.ofMillis(100)).forEach(r -> seen.add(r.value()));
                    consumer.commitSync();
                }
            }
            facts.put("consumed", seen.size());
            facts.put("distinct", new java.util.HashSet<>(seen).size());
            var described = Clients.get(clients.admin().describeShareGroups(List.of("sh-group")).all())
                    .get("sh-group");
            facts.put("described", List.of(described.groupState().name(), described.members().size()));
        }
        // Every record was accepted: a new member of the group gets none of them again.
        try (var later = clients.shareConsumer("sh-group")) {
            later.subscribe(List.of("sh"));
            int again = 0;
            for (int i = 0; i < 10; i++) {
                again += later.poll(Duration.ofMillis(150)).count();
            }
            facts.put("delivered_again", again);
        }
    }

    private static boolean pollUntil(List<KafkaConsumer<String, String>> consumers,
                                     java.util.function.Predicate<List<KafkaConsumer<String, String>>> done) {
        long deadline = System.nanoTime() + Clients.WAIT.toNanos();
        while (System.nanoTime() < deadline) {
            for (KafkaConsumer<String, String> consumer : consumers) {
                consumer.poll(Duration.ofMillis(50));
            }
            if (done.test(consumers)) {
                return true;
            }
        }
        return false;
    }
}
