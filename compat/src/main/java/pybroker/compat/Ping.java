package pybroker.compat;

import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;

/** Prints the cluster id and node count a broker reports: the smallest check that the Java
 *  clients on this classpath reach it. */
public final class Ping {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        try (Admin admin = Admin.create(props)) {
            var cluster = admin.describeCluster();
            System.out.println("{\"cluster_id\": \"" + cluster.clusterId().get()
                    + "\", \"nodes\": " + cluster.nodes().get().size() + "}");
        }
    }
}
