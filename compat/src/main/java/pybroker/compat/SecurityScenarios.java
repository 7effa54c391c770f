package pybroker.compat;

import static pybroker.compat.Clients.errorOf;
import static pybroker.compat.Clients.get;
import static pybroker.compat.Clients.props;

import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterClientQuotasOptions;
import org.apache.kafka.clients.admin.ScramCredentialInfo;
import org.apache.kafka.clients.admin.ScramMechanism;
import org.apache.kafka.clients.admin.UserScramCredentialAlteration;
import org.apache.kafka.clients.admin.UserScramCredentialDeletion;
import org.apache.kafka.clients.admin.UserScramCredentialUpsertion;
import org.apache.kafka.clients.admin.UserScramCredentialsDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AccessControlEntryFilter;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclBindingFilter;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.quota.ClientQuotaAlteration;
import org.apache.kafka.common.quota.ClientQuotaEntity;
import org.apache.kafka.common.quota.ClientQuotaFilter;
import org.apache.kafka.common.quota.ClientQuotaFilterComponent;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourcePatternFilter;
import org.apache.kafka.common.resource.ResourceType;

/** Admin scenarios on security: client quotas, SCRAM credentials (and a SCRAM login with
 *  them), ACLs (kept, listed, deleted; refused without an authorizer; enforced on a SASL
 *  user).  The ACL and login scenarios expect a SASL_PLAINTEXT listener with PLAIN users
 *  admin (a super user) and alice, SCRAM-SHA-256 enabled, and the run's --config logging in
 *  as admin. */
final class SecurityScenarios {
    private SecurityScenarios() {
    }

    static void quotas(Clients clients, Map<String, Object> facts) throws Exception {
        Admin admin = clients.admin();
        ClientQuotaEntity alice = entity(ClientQuotaEntity.USER, "alice");
        ClientQuotaEntity app = entity(ClientQuotaEntity.CLIENT_ID, "app");
        Map<String, String> both = new HashMap<>();
        both.put(ClientQuotaEntity.USER, "alice");
        both.put(ClientQuotaEntity.CLIENT_ID, "app");
        ClientQuotaEntity aliceApp = new ClientQuotaEntity(both);
        ClientQuotaEntity anyUser = entity(ClientQuotaEntity.USER, null);
        ClientQuotaEntity localhost = entity(ClientQuotaEntity.IP, "127.0.0.1");
        get(admin.alterClientQuotas(List.of(
                alteration(alice, "producer_byte_rate", 1024.0, "consumer_byte_rate", 2048.0),
                alteration(app, "request_percentage", 50.0),
                alteration(aliceApp, "producer_byte_rate", 4096.0),
                alteration(anyUser, "producer_byte_rate", 100000.0),
                alteration(localhost, "connection_creation_rate", 30.0))).all());
        facts.put("all", Clients.settled(() -> describe(admin, ClientQuotaFilter.all()), all -> all.size() == 5));
        facts.put("only_alice", describe(admin, ClientQuotaFilter.containsOnly(
                List.of(ClientQuotaFilterComponent.ofEntity(ClientQuotaEntity.USER, "alice")))));
        facts.put("containing_alice", describe(admin, ClientQuotaFilter.contains(
                List.of(ClientQuotaFilterComponent.ofEntity(ClientQuotaEntity.USER, "alice")))));
        facts.put("default_user", describe(admin, ClientQuotaFilter.containsOnly(
                List.of(ClientQuotaFilterComponent.ofDefaultEntity(ClientQuotaEntity.USER)))));
        facts.put("any_client_id", describe(admin, ClientQuotaFilter.contains(
                List.of(ClientQuotaFilterComponent.ofEntityType(ClientQuotaEntity.CLIENT_ID)))));
        get(admin.alterClientQuotas(List.of(alteration(alice, "consumer_byte_rate", null),
                                            alteration(app, "request_percentage", null))).all());
        get(admin.alterClientQuotas(List.of(alteration(alice, "producer_byte_rate", 1.0)),
                                    new AlterClientQuotasOptions().validateOnly(true)).all());
        facts.put("after_removal", Clients.settled(() -> describe(admin, ClientQuotaFilter.contains(
                List.of(ClientQuotaFilterComponent.ofEntity(ClientQuotaEntity.USER, "alice")))),
                found -> !String.valueOf(found).contains("consumer_byte_rate")));
        facts.put("unknown_key", errorOf(() -> get(admin.alterClientQuotas(
                List.of(alteration(alice, "no_such_quota", 1.0))).all())));
        facts.put("ip_with_user", errorOf(() -> {
            Map<String, String> mixed = new HashMap<>();
            mixed.put(ClientQuotaEntity.USER, "alice");
            mixed.put(ClientQuotaEntity.IP, "127.0.0.1");
            get(admin.alterClientQuotas(List.of(alteration(new ClientQuotaEntity(mixed),
                    "producer_byte_rate", 1.0))).all());
        }));
        facts.put("negative", errorOf(() -> get(admin.alterClientQuotas(
                List.of(alteration(alice, "producer_byte_rate", -5.0))).all())));
        get(admin.alterClientQuotas(List.of(alteration(alice, "producer_byte_rate", null),
                alteration(aliceApp, "producer_byte_rate", null),
                alteration(anyUser, "producer_byte_rate", null),
                alteration(localhost, "connection_creation_rate", null))).all());
        facts.put("after_clearing", Clients.settled(() -> describe(admin, ClientQuotaFilter.all()), Map::isEmpty));
    }

    private static ClientQuotaEntity entity(String type, String name) {
        Map<String, String> entries = new HashMap<>();
        entries.put(type, name);
        return new ClientQuotaEntity(entries);
    }

    private static ClientQuotaAlteration alteration(ClientQuotaEntity entity, Object... pairs) {
        List<ClientQuotaAlteration.Op> ops = new ArrayList<>();
        for (int i = 0; i + 1 < pairs.length; i += 2) {
            ops.add(new ClientQuotaAlteration.Op((String) pairs[i], (Double) pairs[i + 1]));
        }
        return new ClientQuotaAlteration(entity, ops);
    }

    /** "type=name,..." (sorted, the default entity as <default>) -> its quotas, sorted. */
    private static Map<String, Object> describe(Admin admin, ClientQuotaFilter filter) throws Exception {
        Map<ClientQuotaEntity, Map<String, Double>> found = get(admin.describeClientQuotas(filter).entities());
        Map<String, Object> described = new TreeMap<>();
        found.forEach((entity, quotas) -> {
            List<String> parts = new ArrayList<>();
            new TreeMap<>(entity.entries()).forEach((type, name) ->
                    parts.add(type + "=" + (name == null ? "<default>" : name)));
            described.put(String.join(",", parts), new TreeMap<>(quotas));
        });
        return described;
    }

    static void scram(Clients clients, Map<String, Object> facts) throws Exception {
        Admin admin = clients.admin();
        get(admin.alterUserScramCredentials(List.of(
                upsert("dora", ScramMechanism.SCRAM_SHA_256, 4096, "dora-secret"),
                upsert("erin", ScramMechanism.SCRAM_SHA_256, 10000, "erin-secret"))).all());
        get(admin.alterUserScramCredentials(List.of(
                upsert("dora", ScramMechanism.SCRAM_SHA_512, 8192, "dora-secret"))).all());
        facts.put("all", Clients.settled(() -> credentials(admin, null), all -> String.valueOf(all).contains("8192")));
        facts.put("dora", credentials(admin, List.of("dora")));
        get(admin.alterUserScramCredentials(List.of(
                new UserScramCredentialDeletion("dora", ScramMechanism.SCRAM_SHA_512))).all());
        facts.put("dora_after_delete", Clients.settled(() -> credentials(admin, List.of("dora")),
                                               dora -> !String.valueOf(dora).contains("512")));
        facts.put("describe_unknown", errorOf(() -> get(admin.describeUserScramCredentials(List.of("nobody"))
                .description("nobody"))));
        facts.put("describe_unknown_all", credentials(admin, List.of("nobody", "erin")));
        facts.put("too_few_iterations", errorOf(() -> get(admin.alterUserScramCredentials(
                List.of(upsert("frank", ScramMechanism.SCRAM_SHA_256, 1000, "x"))).all())));
        facts.put("too_many_iterations", errorOf(() -> get(admin.alterUserScramCredentials(
                List.of(upsert("frank", ScramMechanism.SCRAM_SHA_256, 20000, "x"))).all())));
        facts.put("delete_absent", errorOf(() -> get(admin.alterUserScramCredentials(
                List.of(new UserScramCredentialDeletion("erin", ScramMechanism.SCRAM_SHA_512))).all())));
        facts.put("empty_user", errorOf(() -> get(admin.alterUserScramCredentials(
                List.of(upsert("", ScramMechanism.SCRAM_SHA_256, 4096, "x"))).all())));
        facts.put("user_twice_in_one_request", errorOf(() -> get(admin.alterUserScramCredentials(List.of(
                upsert("gina", ScramMechanism.SCRAM_SHA_256, 4096, "x"),
                upsert("gina", ScramMechanism.SCRAM_SHA_512, 4096, "x"))).all())));
        get(admin.alterUserScramCredentials(List.of(
                new UserScramCredentialDeletion("dora", ScramMechanism.SCRAM_SHA_256),
                new UserScramCredentialDeletion("erin", ScramMechanism.SCRAM_SHA_256))).all());
        facts.put("after_clearing", Clients.settled(() -> credentials(admin, null), Map::isEmpty));
    }

    private static UserScramCredentialUpsertion upsert(String user, ScramMechanism mechanism,
                                                       int iterations, String password) {
        return new UserScramCredentialUpsertion(user, new ScramCredentialInfo(mechanism, iterations), password);
    }

    /** user -> ["MECHANISM:iterations", ...] for the users named (all when null). */
    private static Map<String, Object> credentials(Admin admin, List<String> users) throws Exception {
        Map<String, UserScramCredentialsDescription> found = get(users == null
                ? admin.describeUserScramCredentials().all() : admin.describeUserScramCredentials(users).all());
        Map<String, Object> described = new TreeMap<>();
        found.forEach((user, description) -> described.put(user, description.credentialInfos().stream()
                .map(info -> info.mechanism() + ":" + info.iterations()).sorted().toList()));
        return described;
    }

    /** On a broker without an authorizer, Kafka refuses the ACL APIs. */
    static void aclsDisabled(Clients clients, Map<String, Object> facts) throws Exception {
        Admin admin = clients.admin();
        facts.put("describe", errorOf(() -> get(admin.describeAcls(AclBindingFilter.ANY).values())));
        facts.put("create", errorOf(() -> get(admin.createAcls(List.of(binding(
                ResourceType.TOPIC, "t", PatternType.LITERAL, "User:alice", AclOperation.READ,
                AclPermissionType.ALLOW))).all())));
        facts.put("delete", errorOf(() -> get(admin.deleteAcls(List.of(AclBindingFilter.ANY)).all())));
    }

    static void acls(Clients clients, Map<String, Object> facts) throws Exception {
        Admin admin = clients.admin();
        List<AclBinding> bindings = List.of(
                binding(ResourceType.TOPIC, "acl-", PatternType.PREFIXED, "User:alice", AclOperation.WRITE, AclPermissionType.ALLOW),
                binding(ResourceType.GROUP, "acl-group", PatternType.LITERAL, "User:alice", AclOperation.READ, AclPermissionType.ALLOW),
                binding(ResourceType.TOPIC, "acl-secret", PatternType.LITERAL, "User:alice", AclOperation.WRITE, AclPermissionType.DENY),
                binding(ResourceType.CLUSTER, "kafka-cluster", PatternType.LITERAL, "User:bob", AclOperation.DESCRIBE, AclPermissionType.ALLOW));
        get(admin.createAcls(bindings).all());
        facts.put("all", aclCount(admin, AclBindingFilter.ANY));
        facts.put("of_alice", aclCount(admin, new AclBindingFilter(ResourcePatternFilter.ANY,
                new AccessControlEntryFilter("User:alice", null, AclOperation.ANY, AclPermissionType.ANY))));
        facts.put("matching_acl_x", aclCount(admin, new AclBindingFilter(
                new ResourcePatternFilter(ResourceType.TOPIC, "acl-x", PatternType.MATCH), AccessControlEntryFilter.ANY)));
        facts.put("matching_acl_secret", aclCount(admin, new AclBindingFilter(
                new ResourcePatternFilter(ResourceType.TOPIC, "acl-secret", PatternType.MATCH), AccessControlEntryFilter.ANY)));
        facts.put("prefixed", aclCount(admin, new AclBindingFilter(
                new ResourcePatternFilter(ResourceType.ANY, null, PatternType.PREFIXED), AccessControlEntryFilter.ANY)));
        facts.put("create_again", errorOf(() -> get(admin.createAcls(bindings.subList(0, 1)).all())));
        facts.put("all_after_create_again", aclCount(admin, AclBindingFilter.ANY));
        facts.put("bad_cluster_name", errorOf(() -> get(admin.createAcls(List.of(binding(
                ResourceType.CLUSTER, "foo", PatternType.LITERAL, "User:bob", AclOperation.ALTER,
                AclPermissionType.ALLOW))).all())));
        facts.put("bad_principal", errorOf(() -> get(admin.createAcls(List.of(binding(
                ResourceType.TOPIC, "t", PatternType.LITERAL, "alice", AclOperation.READ,
                AclPermissionType.ALLOW))).all())));
        Collection<AclBinding> denied = get(admin.deleteAcls(List.of(new AclBindingFilter(ResourcePatternFilter.ANY,
                new AccessControlEntryFilter(null, null, AclOperation.ANY, AclPermissionType.DENY)))).all());
        facts.put("deleted_deny", denied.stream().map(b -> b.pattern().name()).toList());
        facts.put("deleted_nothing", get(admin.deleteAcls(List.of(new AclBindingFilter(
                new ResourcePatternFilter(ResourceType.TOPIC, "absent", PatternType.LITERAL),
                AccessControlEntryFilter.ANY))).all()).size());
        facts.put("all_after_delete", aclCount(admin, AclBindingFilter.ANY));
        facts.put("deleted_rest", get(admin.deleteAcls(List.of(AclBindingFilter.ANY)).all()).size());
        facts.put("all_at_end", aclCount(admin, AclBindingFilter.ANY));
    }

    private static AclBinding binding(ResourceType type, String name, PatternType pattern,
                                      String principal, AclOperation operation, AclPermissionType permission) {
        return new AclBinding(new ResourcePattern(type, name, pattern),
                              new AccessControlEntry(principal, "*", operation, permission));
    }

    private static int aclCount(Admin admin, AclBindingFilter filter) throws Exception {
        return get(admin.describeAcls(filter).values()).size();
    }

    private static Properties plainUser(String user) {
        return props("sasl.mechanism", "PLAIN", "sasl.jaas.config",
                     "org.apache.kafka.common.security.plain.PlainLoginModule required username=\""
                     + user + "\" password=\"" + user + "-secret\";");
    }

    /** alice (PLAIN) is refused until ACLs let her write, read and commit; she may not
     *  describe ACLs or create topics. */
    static void aclsEnforced(Clients clients, Map<String, Object> facts) throws Exception {
        Admin admin = clients.admin();
        clients.createTopic("acl-orders", 1, Map.of());
        TopicPartition partition = new TopicPartition("acl-orders", 0);
        Properties alice = plainUser("alice");
        try (KafkaProducer<String, String> producer = clients.producer(alice)) {
            facts.put("write_without_acl", errorOf(() -> producer.send(new ProducerRecord<>("acl-orders", "k", "v")).get()));
        }
        get(admin.createAcls(List.of(
                binding(ResourceType.TOPIC, "acl-", PatternType.PREFIXED, "User:alice", AclOperation.WRITE, AclPermissionType.ALLOW))).all());
        try (KafkaProducer<String, String> producer = clients.producer(alice)) {
            facts.put("write_with_acl_offset", producer.send(new ProducerRecord<>("acl-orders", 0, "k", "v")).get().offset());
        }
        try (KafkaConsumer<String, String> consumer = clients.consumer(alice)) {
            consumer.assign(List.of(partition));
            facts.put("read_without_acl", errorOf(() -> consumer.poll(java.time.Duration.ofSeconds(5))));
        }
        get(admin.createAcls(List.of(
                binding(ResourceType.TOPIC, "acl-orders", PatternType.LITERAL, "User:alice", AclOperation.READ, AclPermissionType.ALLOW))).all());
        try (KafkaConsumer<String, String> consumer = clients.consumer(alice)) {
            consumer.assign(List.of(partition));
            facts.put("read_with_acl", Clients.values(Clients.poll(consumer, 1)));
        }
        Properties member = new Properties();
        member.putAll(alice);
        member.put(ConsumerConfig.GROUP_ID_CONFIG, "acl-group");
        try (KafkaConsumer<String, String> consumer = clients.consumer(member)) {
            facts.put("commit_without_group_acl", errorOf(() -> consumer.commitSync(Map.of(partition, new OffsetAndMetadata(1)))));
        }
        get(admin.createAcls(List.of(
                binding(ResourceType.GROUP, "acl-group", PatternType.LITERAL, "User:alice", AclOperation.READ, AclPermissionType.ALLOW))).all());
        try (KafkaConsumer<String, String> consumer = clients.consumer(member)) {
            consumer.commitSync(Map.of(partition, new OffsetAndMetadata(1)));
            facts.put("committed_with_group_acl", consumer.committed(java.util.Set.of(partition)).get(partition).offset());
        }
        Properties transactional = new Properties();
        transactional.putAll(alice);
        transactional.put(org.apache.kafka.clients.producer.ProducerConfig.TRANSACTIONAL_ID_CONFIG, "acl-tx");
        try (KafkaProducer<String, String> producer = clients.producer(transactional)) {
            facts.put("transactional_without_acl", errorOf(producer::initTransactions));
        }
        get(admin.createAcls(List.of(binding(ResourceType.TRANSACTIONAL_ID, "acl-", PatternType.PREFIXED,
                "User:alice", AclOperation.WRITE, AclPermissionType.ALLOW))).all());
        try (KafkaProducer<String, String> producer = clients.producer(transactional)) {
            producer.initTransactions();
            producer.beginTransaction();
            producer.send(new ProducerRecord<>("acl-orders", 0, "k", "in-transaction")).get();
            producer.sendOffsetsToTransaction(Map.of(partition, new OffsetAndMetadata(2)),
                    new org.apache.kafka.clients.consumer.ConsumerGroupMetadata("acl-group"));
            producer.commitTransaction();
            facts.put("transactional_with_acl", "committed");
            producer.beginTransaction();
            producer.send(new ProducerRecord<>("acl-orders", 0, "k", "in-transaction")).get();
            facts.put("offsets_for_unreadable_group", errorOf(() -> producer.sendOffsetsToTransaction(
                    Map.of(partition, new OffsetAndMetadata(2)),
                    new org.apache.kafka.clients.consumer.ConsumerGroupMetadata("other-group"))));
            errorOf(producer::abortTransaction);
        }
        try (Admin asAlice = clients.newAdmin(alice)) {
            facts.put("alice_describe_acls", errorOf(() -> get(asAlice.describeAcls(AclBindingFilter.ANY).values())));
            facts.put("alice_create_topic", errorOf(() -> get(asAlice.createTopics(
                    List.of(new org.apache.kafka.clients.admin.NewTopic("acl-new", 1, (short) 1))).all())));
            facts.put("alice_topics", new TreeMap<>(Map.of("listed", get(asAlice.listTopics().names()).stream().sorted().toList())));
        }
        get(admin.deleteAcls(List.of(AclBindingFilter.ANY)).all());
    }

    /** A SCRAM-SHA-256 credential made through the admin API logs a client in; a wrong
     *  password, or the credential deleted, does not. */
    static void scramLogin(Clients clients, Map<String, Object> facts) throws Exception {
        Admin admin = clients.admin();
        get(admin.alterUserScramCredentials(List.of(
                upsert("carol", ScramMechanism.SCRAM_SHA_256, 4096, "carol-secret"))).all());
        facts.put("login", login("carol", "carol-secret", clients));
        facts.put("wrong_password", login("carol", "nope", clients));
        get(admin.alterUserScramCredentials(List.<UserScramCredentialAlteration>of(
                new UserScramCredentialDeletion("carol", ScramMechanism.SCRAM_SHA_256))).all());
        facts.put("after_delete", login("carol", "carol-secret", clients));
    }

    private static String login(String user, String password, Clients clients) {
        Properties scram = props("sasl.mechanism", "SCRAM-SHA-256", "sasl.jaas.config",
                "org.apache.kafka.common.security.scram.ScramLoginModule required username=\""
                + user + "\" password=\"" + password + "\";");
        try (Admin asUser = clients.newAdmin(scram)) {
            return errorOf(() -> get(asUser.describeCluster().nodes()).size());
        }
    }
}
