package pybroker.compat;

import static pybroker.compat.Clients.errorOf;
import static pybroker.compat.Clients.get;
import static pybroker.compat.Clients.props;

import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.TreeMap;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.AlterConfigOp.OpType;
import org.apache.kafka.clients.admin.AlterConfigsOptions;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.CreateTopicsOptions;
import org.apache.kafka.clients.admin.CreateTopicsResult;
import org.apache.kafka.clients.admin.DescribeConfigsOptions;
import org.apache.kafka.clients.admin.DescribeConsumerGroupsOptions;
import org.apache.kafka.clients.admin.GroupListing;
import org.apache.kafka.clients.admin.ListConsumerGroupOffsetsSpec;
import org.apache.kafka.clients.admin.ListGroupsOptions;
import org.apache.kafka.clients.admin.ListOffsetsOptions;
import org.apache.kafka.clients.admin.MemberToRemove;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RemoveMembersFromConsumerGroupOptions;
import org.apache.kafka.clients.admin.LogDirDescription;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.ReplicaInfo;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.TopicCollection;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.TopicPartitionReplica;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.config.ConfigResource;

/** Admin scenarios on topics, configs, consumer groups and records: what each call answers,
 *  and the error class of each call Kafka refuses. */
final class AdminScenarios {
    private AdminScenarios() {
    }

    static void topics(Clients clients, Map<String, Object> facts) throws Exception {
        Admin admin = clients.admin();
        NewTopic compacted = new NewTopic("adm-b", 1, (short) 1).configs(Map.of("cleanup.policy", "compact"));
        CreateTopicsResult created = admin.createTopics(List.of(new NewTopic("adm-a", 3, (short) 1), compacted));
        get(created.all());
        facts.put("created_partitions", get(created.numPartitions("adm-a")));
        facts.put("created_replication", (int) get(created.replicationFactor("adm-a")));
        facts.put("created_cleanup_policy", get(created.config("adm-b")).get("cleanup.policy").value());
        facts.put("created_topic_id_set", !get(created.topicId("adm-a")).equals(Uuid.ZERO_UUID));
        facts.put("create_existing", errorOf(() -> get(admin.createTopics(
                List.of(new NewTopic("adm-a", 1, (short) 1))).all())));
        facts.put("create_validate_only", errorOf(() -> get(admin.createTopics(
                List.of(new NewTopic("adm-c", 2, (short) 1)), new CreateTopicsOptions().validateOnly(true)).all())));
        facts.put("create_replication_3", errorOf(() -> get(admin.createTopics(
                List.of(new NewTopic("adm-d", 1, (short) 3))).all())));
        facts.put("create_unknown_config", errorOf(() -> get(admin.createTopics(
                List.of(new NewTopic("adm-e", 1, (short) 1).configs(Map.of("no.such.config", "1")))).all())));
        facts.put("create_bad_name", errorOf(() -> get(admin.createTopics(
                List.of(new NewTopic("bad name!", 1, (short) 1))).all())));
        facts.put("create_zero_partitions", errorOf(() -> get(admin.createTopics(
                List.of(new NewTopic("adm-f", 0, (short) 1))).all())));
        Set<String> names = get(admin.listTopics().names());
        facts.put("listed", List.of(names.contains("adm-a"), names.contains("adm-b"), names.contains("adm-c")));

        TopicDescription described = get(admin.describeTopics(List.of("adm-a")).allTopicNames()).get("adm-a");
        int node = get(admin.describeCluster().nodes()).iterator().next().id();
        facts.put("described_partitions", described.partitions().size());
        facts.put("described_internal", described.isInternal());
        facts.put("leaders_are_the_node", described.partitions().stream().allMatch(
                p -> p.leader() != null && p.leader().id() == node
                        && p.replicas().size() == 1 && p.isr().size() == 1));
        Uuid id = described.topicId();
        facts.put("described_by_id", get(admin.describeTopics(TopicCollection.ofTopicIds(List.of(id)))
                .allTopicIds()).get(id).name());
        facts.put("describe_missing", errorOf(() -> get(admin.describeTopics(List.of("adm-none")).allTopicNames())));

        get(admin.createPartitions(Map.of("adm-a", NewPartitions.increaseTo(5))).all());
        facts.put("grown_partitions", partitions(admin, "adm-a", 5).get("indexes"));
        facts.put("shrink", errorOf(() -> get(admin.createPartitions(Map.of("adm-a", NewPartitions.increaseTo(2))).all())));
        facts.put("same_count", errorOf(() -> get(admin.createPartitions(Map.of("adm-a", NewPartitions.increaseTo(5))).all())));
        facts.put("grow_missing", errorOf(() -> get(admin.createPartitions(Map.of("adm-none", NewPartitions.increaseTo(5))).all())));

        get(admin.deleteTopics(List.of("adm-a")).all());
        facts.put("gone_after_delete", waitGone(admin, "adm-a"));
        facts.put("delete_missing", errorOf(() -> get(admin.deleteTopics(List.of("adm-none")).all())));
        Uuid compactedId = get(created.topicId("adm-b"));
        get(admin.deleteTopics(TopicCollection.ofTopicIds(List.of(compactedId))).all());
        facts.put("gone_after_delete_by_id", waitGone(admin, "adm-b"));
        get(admin.createTopics(List.of(new NewTopic("adm-g", Map.of(0, List.of(node), 1, List.of(node))),
                new NewTopic("adm-h", Optional.empty(), Optional.empty()))).all());
        var assigned = get(admin.describeTopics(List.of("adm-g", "adm-h")).allTopicNames());
        facts.put("assigned_partitions", assigned.get("adm-g").partitions().size());
        facts.put("default_partitions", assigned.get("adm-h").partitions().size());
        facts.put("assign_unknown_broker", errorOf(() -> get(admin.createTopics(
                List.of(new NewTopic("adm-i", Map.of(0, List.of(node + 100))))).all())));
        get(admin.createPartitions(Map.of("adm-g", NewPartitions.increaseTo(3, List.of(List.of(node))))).all());
        facts.put("grown_with_assignment", ((List<?>) partitions(admin, "adm-g", 3).get("indexes")).size());
        facts.put("grow_to_unknown_broker", errorOf(() -> get(admin.createPartitions(Map.of(
                "adm-g", NewPartitions.increaseTo(4, List.of(List.of(node + 100))))).all())));
        facts.put("cluster_nodes", get(admin.describeCluster().nodes()).size());
        facts.put("controller_is_the_node", get(admin.describeCluster().controller()).id() == node);
        facts.put("cluster_id_set", get(admin.describeCluster().clusterId()) != null);
    }

    /** {"indexes": the topic's partitions} once there are `count` (or at the deadline). */
    private static Map<String, Object> partitions(Admin admin, String topic, int count) throws Exception {
        return Clients.settled(() -> Map.of("indexes", get(admin.describeTopics(List.of(topic)).allTopicNames())
                        .get(topic).partitions().stream().map(TopicPartitionInfo::partition).toList()),
                found -> ((List<?>) found.get("indexes")).size() == count);
    }

    private static boolean waitGone(Admin admin, String topic) throws Exception {
        long deadline = System.nanoTime() + Clients.WAIT.toNanos();
        while (System.nanoTime() < deadline) {
            if (!get(admin.listTopics().names()).contains(topic)) {
                return true;
            }
            Thread.sleep(50);
        }
        return false;
    }

    static void configs(Clients clients, Map<String, Object> facts) throws Exception {
        Admin admin = clients.admin();
        clients.createTopic("cfg", 1, Map.of());
        ConfigResource topic = new ConfigResource(ConfigResource.Type.TOPIC, "cfg");
        alter(admin, topic, new AlterConfigOp(new ConfigEntry("retention.ms", "3600000"), OpType.SET),
              new AlterConfigOp(new ConfigEntry("cleanup.policy", "compact"), OpType.SET));
        facts.put("after_set", settled(admin, topic, "retention.ms", "3600000",
                                       "retention.ms", "cleanup.policy", "max.message.bytes"));
        alter(admin, topic, new AlterConfigOp(new ConfigEntry("cleanup.policy", "delete"), OpType.APPEND));
        facts.put("after_append", settled(admin, topic, "cleanup.policy", "compact,delete", "cleanup.policy"));
        alter(admin, topic, new AlterConfigOp(new ConfigEntry("cleanup.policy", "compact"), OpType.SUBTRACT));
        facts.put("after_subtract", settled(admin, topic, "cleanup.policy", "delete", "cleanup.policy"));
        alter(admin, topic, new AlterConfigOp(new ConfigEntry("retention.ms", null), OpType.DELETE));
        facts.put("after_delete", settled(admin, topic, "retention.ms", "604800000", "retention.ms"));
        get(admin.incrementalAlterConfigs(Map.of(topic, List.of(new AlterConfigOp(
                new ConfigEntry("segment.bytes", "1048576"), OpType.SET))),
                new AlterConfigsOptions().validateOnly(true)).all());
        facts.put("after_validate_only", entries(admin, topic, "segment.bytes"));
        facts.put("set_unknown", errorOf(() -> alter(admin, topic,
                new AlterConfigOp(new ConfigEntry("no.such.config", "1"), OpType.SET))));
        facts.put("set_bad_value", errorOf(() -> alter(admin, topic,
                new AlterConfigOp(new ConfigEntry("retention.ms", "soon"), OpType.SET))));
        var mixed = admin.incrementalAlterConfigs(Map.of(topic, List.of(new AlterConfigOp(
                        new ConfigEntry("segment.ms", "3600000"), OpType.SET)),
                new ConfigResource(ConfigResource.Type.TOPIC, "cfg-none"), List.of(new AlterConfigOp(
                        new ConfigEntry("segment.ms", "3600000"), OpType.SET)))).values();
        Map<String, Object> perResource = new TreeMap<>();
        mixed.forEach((resource, future) -> perResource.put(resource.name(), errorOf(() -> get(future))));
        facts.put("two_resources", perResource);
        facts.put("set_missing_topic", errorOf(() -> alter(admin,
                new ConfigResource(ConfigResource.Type.TOPIC, "cfg-none"),
                new AlterConfigOp(new ConfigEntry("retention.ms", "1000"), OpType.SET))));

        alter(admin, topic, new AlterConfigOp(new ConfigEntry("retention.ms", "7200000"), OpType.SET));
        settled(admin, topic, "retention.ms", "7200000", "retention.ms");
        facts.put("legacy_validate_only", LegacyAlterConfigs.alter(clients.bootstrap, topic,
                Map.of("max.message.bytes", "3000000"), true).error().name());
        facts.put("legacy_unknown", LegacyAlterConfigs.alter(clients.bootstrap, topic,
                Map.of("no.such.config", "1"), false).error().name());
        facts.put("legacy", LegacyAlterConfigs.alter(clients.bootstrap, topic,
                Map.of("max.message.bytes", "2000000"), false).error().name());
        facts.put("after_legacy", settled(admin, topic, "max.message.bytes", "2000000",
                                          "max.message.bytes", "retention.ms", "cleanup.policy"));

        Config withSynonyms = get(admin.describeConfigs(List.of(topic),
                new DescribeConfigsOptions().includeSynonyms(true).includeDocumentation(true)).all()).get(topic);
        ConfigEntry maxBytes = withSynonyms.get("max.message.bytes");
        facts.put("synonym_sources", maxBytes.synonyms().stream().map(s -> s.name() + ":" + s.source()).toList());
        facts.put("documented", maxBytes.documentation() != null && !maxBytes.documentation().isEmpty());
        facts.put("type", String.valueOf(maxBytes.type()));
        facts.put("describe_missing_topic", errorOf(() -> get(admin.describeConfigs(
                List.of(new ConfigResource(ConfigResource.Type.TOPIC, "cfg-none"))).all())));

        int node = get(admin.describeCluster().nodes()).iterator().next().id();
        ConfigResource broker = new ConfigResource(ConfigResource.Type.BROKER, String.valueOf(node));
        Config brokerConfig = get(admin.describeConfigs(List.of(broker)).all()).get(broker);
        Map<String, Object> brokerFacts = new TreeMap<>();
        for (String name : List.of("message.max.bytes", "log.retention.hours", "auto.create.topics.enable")) {
            ConfigEntry entry = brokerConfig.get(name);
            brokerFacts.put(name, entry == null ? null : entry.value());
        }
        facts.put("broker", brokerFacts);
        facts.put("broker_entries_over_100", brokerConfig.entries().size() > 100);
    }

    private static void alter(Admin admin, ConfigResource resource, AlterConfigOp... ops) throws Exception {
        get(admin.incrementalAlterConfigs(Map.of(resource, List.of(ops))).all());
    }

    /** The named entries once `name` has `value` (or at the deadline). */
    private static Map<String, Object> settled(Admin admin, ConfigResource resource, String name,
                                               String value, String... names) throws Exception {
        return Clients.settled(() -> entries(admin, resource, names),
                found -> found.get(name) instanceof List<?> entry && value.equals(entry.get(0)));
    }

    /** name -> [value, source] of the named entries of one resource's description. */
    private static Map<String, Object> entries(Admin admin, ConfigResource resource, String... names)
            throws Exception {
        Config config = get(admin.describeConfigs(List.of(resource)).all()).get(resource);
        Map<String, Object> found = new TreeMap<>();
        for (String name : names) {
            ConfigEntry entry = config.get(name);
            found.put(name, entry == null ? null : java.util.Arrays.asList(entry.value(), entry.source().name()));
        }
        return found;
    }

    /** An empty group with committed offsets ("grp-empty": 3 and 5) and a live one
     *  ("grp-live", one member): listed, described, offsets listed, altered, deleted; the
     *  groups deleted. */
    static void groups(Clients clients, Map<String, Object> facts) throws Exception {
        Admin admin = clients.admin();
        clients.createAndFill("grp", 2, 5);
        TopicPartition p0 = new TopicPartition("grp", 0);
        TopicPartition p1 = new TopicPartition("grp", 1);
        try (KafkaConsumer<String, String> simple = clients.consumer(props(ConsumerConfig.GROUP_ID_CONFIG, "grp-empty"))) {
            simple.assign(List.of(p0, p1));
            simple.commitSync(Map.of(p0, new OffsetAndMetadata(3, "three"), p1, new OffsetAndMetadata(5)));
        }
        try (KafkaConsumer<String, String> live = clients.consumer(props(
                ConsumerConfig.GROUP_ID_CONFIG, "grp-live", ConsumerConfig.CLIENT_ID_CONFIG, "live-client"))) {
            live.subscribe(List.of("grp"));
            Clients.poll(live, 10);
            live.commitSync();
            liveGroup(admin, facts, p0);
        }
        facts.put("listed_consumer_groups", groupStates(admin, ListGroupsOptions.forConsumerGroups()));
        facts.put("empty_offsets", offsets(admin, "grp-empty"));
        facts.put("metadata_kept", get(admin.listConsumerGroupOffsets("grp-empty").partitionsToOffsetAndMetadata())
                .get(p0).metadata());
        ConsumerGroupDescription empty = get(admin.describeConsumerGroups(List.of("grp-empty")).all()).get("grp-empty");
        facts.put("empty_described", List.of(empty.groupState().name(), empty.members().size(),
                                             empty.isSimpleConsumerGroup()));
        get(admin.alterConsumerGroupOffsets("grp-empty", Map.of(p0, new OffsetAndMetadata(1))).all());
        facts.put("after_alter", offsets(admin, "grp-empty"));
        get(admin.deleteConsumerGroupOffsets("grp-empty", Set.of(p1)).all());
        facts.put("after_offset_delete", offsets(admin, "grp-empty"));
        facts.put("alter_missing_topic", errorOf(() -> get(admin.alterConsumerGroupOffsets("grp-empty",
                Map.of(new TopicPartition("grp-none", 0), new OffsetAndMetadata(1))).all())));
        facts.put("offsets_of_unknown_group", offsets(admin, "grp-none"));
        facts.put("describe_unknown_group", errorOf(() -> get(admin.describeConsumerGroups(List.of("grp-none")).all())));
        get(admin.deleteConsumerGroups(List.of("grp-empty", "grp-live")).all());
        facts.put("after_group_delete", groupStates(admin, ListGroupsOptions.forConsumerGroups()));
        facts.put("delete_unknown_group", errorOf(() -> get(admin.deleteConsumerGroups(List.of("grp-none")).all())));
    }

    /** What the admin sees of a group while its one member is in it. */
    private static void liveGroup(Admin admin, Map<String, Object> facts, TopicPartition p0) throws Exception {
        facts.put("listed_while_live", groupStates(admin, new ListGroupsOptions()));
        @SuppressWarnings("deprecation")
        var consumerGroups = get(admin.listConsumerGroups().all());
        facts.put("list_consumer_groups", consumerGroups.stream().map(g -> g.groupId() + ":"
                + g.groupState().map(Enum::name).orElse("?")).filter(g -> g.startsWith("grp-")).sorted().toList());
        ConsumerGroupDescription live = get(admin.describeConsumerGroups(List.of("grp-live")).all()).get("grp-live");
        List<Object> members = new ArrayList<>();
        for (MemberDescription member : live.members()) {
            members.add(List.of(member.clientId(), member.assignment().topicPartitions().size(),
                                member.host().isEmpty() ? "" : "host"));
        }
        facts.put("live_described", List.of(live.groupState().name(), live.partitionAssignor(),
                                            live.type().name(), live.isSimpleConsumerGroup()));
        facts.put("live_members", members);
        facts.put("live_operations", get(admin.describeConsumerGroups(List.of("grp-live"),
                new DescribeConsumerGroupsOptions().includeAuthorizedOperations(true)).all())
                .get("grp-live").authorizedOperations().stream().map(Enum::name).sorted().toList());
        facts.put("listed_stable", groupStates(admin, new ListGroupsOptions()
                .inGroupStates(Set.of(org.apache.kafka.common.GroupState.STABLE))).keySet());
        facts.put("live_offsets", offsets(admin, "grp-live"));
        facts.put("alter_live", errorOf(() -> get(admin.alterConsumerGroupOffsets("grp-live",
                Map.of(p0, new OffsetAndMetadata(0))).all())));
        facts.put("offset_delete_live", errorOf(() -> get(admin.deleteConsumerGroupOffsets("grp-live",
                Set.of(p0)).all())));
        facts.put("delete_live", errorOf(() -> get(admin.deleteConsumerGroups(List.of("grp-live")).all())));
        var both = get(admin.listConsumerGroupOffsets(Map.of(
                "grp-empty", new ListConsumerGroupOffsetsSpec(),
                "grp-live", new ListConsumerGroupOffsetsSpec().topicPartitions(List.of(p0)))).all());
        Map<String, Object> batched = new TreeMap<>();
        both.forEach((group, offsets) -> batched.put(group, offsets.size()));
        facts.put("batched_offsets", batched);
        get(admin.removeMembersFromConsumerGroup("grp-live", new RemoveMembersFromConsumerGroupOptions()).all());
        ConsumerGroupDescription emptied = get(admin.describeConsumerGroups(List.of("grp-live")).all()).get("grp-live");
        facts.put("after_remove_members", List.of(emptied.groupState().name(), emptied.members().size()));
        facts.put("remove_unknown_instance", errorOf(() -> get(admin.removeMembersFromConsumerGroup("grp-live",
                new RemoveMembersFromConsumerGroupOptions(List.of(new MemberToRemove("no-such-instance")))).all())));
    }

    private static Map<String, Object> groupStates(Admin admin, ListGroupsOptions options) throws Exception {
        Collection<GroupListing> listings = get(admin.listGroups(options).all());
        Map<String, Object> states = new TreeMap<>();
        for (GroupListing listing : listings) {
            if (listing.groupId().startsWith("grp-")) {
                states.put(listing.groupId(), List.of(
                        listing.groupState().map(Enum::name).orElse("?"),
                        listing.type().map(Enum::name).orElse("?"), listing.protocol()));
            }
        }
        return states;
    }

    private static Map<String, Object> offsets(Admin admin, String group) throws Exception {
        Map<TopicPartition, OffsetAndMetadata> listed =
                get(admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata());
        Map<String, Object> offsets = new TreeMap<>();
        listed.forEach((partition, offset) -> offsets.put(partition.toString(), offset == null ? null : offset.offset()));
        return offsets;
    }

    /** Ten records of one idempotent producer: deleteRecords below and past the end,
     *  describeLogDirs, describeReplicaLogDirs, describeProducers. */
    static void records(Clients clients, Map<String, Object> facts) throws Exception {
        Admin admin = clients.admin();
        clients.createTopic("recs", 1, Map.of());
        TopicPartition partition = new TopicPartition("recs", 0);
        try (KafkaProducer<String, String> producer = clients.producer(props(
                ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true"))) {
            Clients.send(producer, "recs", 0, "r", 10, -1);
        }
        facts.put("low_watermark", get(admin.deleteRecords(Map.of(partition, RecordsToDelete.beforeOffset(4)))
                .lowWatermarks().get(partition)).lowWatermark());
        try (KafkaConsumer<String, String> consumer = clients.consumer(new java.util.Properties())) {
            consumer.assign(List.of(partition));
            facts.put("beginning_after_delete", consumer.beginningOffsets(List.of(partition)).get(partition));
            consumer.seek(partition, 2);
            facts.put("first_read_after_seek_2", Clients.poll(consumer, 1).get(0).offset());
        }
        facts.put("delete_past_end", errorOf(() -> get(admin.deleteRecords(
                Map.of(partition, RecordsToDelete.beforeOffset(11))).all())));
        facts.put("delete_to_end", get(admin.deleteRecords(Map.of(partition, RecordsToDelete.beforeOffset(-1)))
                .lowWatermarks().get(partition)).lowWatermark());

        int node = get(admin.describeCluster().nodes()).iterator().next().id();
        Map<String, LogDirDescription> dirs = get(admin.describeLogDirs(List.of(node)).allDescriptions()).get(node);
        facts.put("log_dirs", dirs.size());
        String dirWithRecs = null;
        for (Map.Entry<String, LogDirDescription> dir : dirs.entrySet()) {
            ReplicaInfo info = dir.getValue().replicaInfos().get(partition);
            if (info != null) {
                dirWithRecs = dir.getKey();
                facts.put("replica", List.of(info.size() > 0, info.offsetLag(), info.isFuture()));
                facts.put("dir_error", dir.getValue().error() == null ? "none" : dir.getValue().error().getClass().getSimpleName());
                facts.put("dir_bytes_known", dir.getValue().totalBytes().isPresent()
                          && dir.getValue().usableBytes().isPresent()
                          && dir.getValue().usableBytes().getAsLong() <= dir.getValue().totalBytes().getAsLong());
            }
        }
        facts.put("dir_holds_recs", dirWithRecs != null);
        TopicPartitionReplica replica = new TopicPartitionReplica("recs", 0, node);
        var replicaDir = get(admin.describeReplicaLogDirs(List.of(replica)).all()).get(replica);
        facts.put("replica_dir_matches", replicaDir.getCurrentReplicaLogDir() != null
                  && replicaDir.getCurrentReplicaLogDir().equals(dirWithRecs));

        var producers = get(admin.describeProducers(List.of(partition)).partitionResult(partition)).activeProducers();
        facts.put("producers", producers.stream().map(p -> List.of(p.lastSequence(), (int) p.producerEpoch(),
                p.currentTransactionStartOffset().isPresent(), p.lastTimestamp() > 0)).toList());
    }
}
