package pybroker.compat;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;

/** Runs named scenarios of Kafka's Java clients (producer, consumer, admin) against one broker
 *  and prints one JSON line per scenario: {"scenario", "ok", "facts", "error", "ms"}.  The
 *  facts are what the broker answered (values, counts, offsets, error classes), for the
 *  caller to assert; a scenario that throws is reported with ok=false and the error.
 *
 *  <p>Usage: {@code ClientsCheck <bootstrap> [--config key=value]... scenario...}; the
 *  configs go to every client (e.g. SASL settings), {@code --list} prints the names. */
public final class ClientsCheck {
    /** One scenario: what it found, as facts; throws when a step fails outright. */
    interface Scenario {
        void run(Clients clients, Map<String, Object> facts) throws Exception;
    }

    static final Map<String, Scenario> SCENARIOS = new LinkedHashMap<>();

    static {
        SCENARIOS.put("producer_idempotent", ProducerScenarios::idempotent);
        SCENARIOS.put("transactions", ProducerScenarios::consumeTransformProduce);
        SCENARIOS.put("transactions_fenced", ProducerScenarios::fenced);
        SCENARIOS.put("producer_formats", ProducerScenarios::formats);
        SCENARIOS.put("consumer_group", ConsumerScenarios::group);
        SCENARIOS.put("consumer_positions", ConsumerScenarios::positions);
        SCENARIOS.put("consumer_rebalance", ConsumerScenarios::rebalance);
        SCENARIOS.put("consumer_static", ConsumerScenarios::staticMembership);
        SCENARIOS.put("consumer_protocol", ConsumerScenarios::modernGroup);
        SCENARIOS.put("share_group", ConsumerScenarios::shareGroup);
        SCENARIOS.put("admin_topics", AdminScenarios::topics);
        SCENARIOS.put("admin_configs", AdminScenarios::configs);
        SCENARIOS.put("admin_groups", AdminScenarios::groups);
        SCENARIOS.put("admin_records", AdminScenarios::records);
        SCENARIOS.put("admin_quotas", SecurityScenarios::quotas);
        SCENARIOS.put("admin_scram", SecurityScenarios::scram);
        SCENARIOS.put("admin_acls", SecurityScenarios::acls);
        SCENARIOS.put("acls_disabled", SecurityScenarios::aclsDisabled);
        SCENARIOS.put("acls_enforced", SecurityScenarios::aclsEnforced);
        SCENARIOS.put("scram_login", SecurityScenarios::scramLogin);
    }

    public static void main(String[] args) throws Exception {
        if (args.length == 1 && args[0].equals("--list")) {
            SCENARIOS.keySet().forEach(System.out::println);
            return;
        }
        if (args.length < 2) {
            System.err.println("usage: ClientsCheck <bootstrap> [--config key=value]... scenario...");
            System.exit(2);
        }
        Properties common = new Properties();
        List<String> names = new ArrayList<>();
        for (int i = 1; i < args.length; i++) {
            if (args[i].equals("--config") && i + 1 < args.length) {
                String[] pair = args[++i].split("=", 2);
                common.put(pair[0], pair.length > 1 ? pair[1] : "");
            } else if (SCENARIOS.containsKey(args[i])) {
                names.add(args[i]);
            } else {
                System.err.println("unknown scenario " + args[i] + "; --list names them");
                System.exit(2);
            }
        }
        Clients clients = new Clients(args[0], common);
        for (String name : names) {
            System.out.println(Json.write(run(name, clients)));
            System.out.flush();
        }
        System.exit(0);  // client threads (a fenced producer's sender) must not keep the JVM
    }

    static Map<String, Object> run(String name, Clients clients) {
        Map<String, Object> facts = new LinkedHashMap<>();
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("scenario", name);
        long started = System.nanoTime();
        try {
            SCENARIOS.get(name).run(clients, facts);
            line.put("ok", true);
        } catch (Throwable error) {
            line.put("ok", false);
            line.put("error", Clients.describe(unwrap(error)));
        }
        line.put("ms", (System.nanoTime() - started) / 1_000_000);
        line.put("facts", facts);
        return line;
    }

    static Throwable unwrap(Throwable error) {
        while (error instanceof ExecutionException && error.getCause() != null) {
            error = error.getCause();
        }
        return error;
    }
}
