package pybroker.compat;

import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.protocol.ApiKeys;
import org.apache.kafka.common.requests.AbstractResponse;
import org.apache.kafka.common.requests.AlterConfigsRequest;
import org.apache.kafka.common.requests.AlterConfigsResponse;
import org.apache.kafka.common.requests.ApiError;
import org.apache.kafka.common.requests.RequestHeader;

/** The legacy AlterConfigs request (the whole set of a resource's configs), which the 4.x
 *  Admin no longer sends: built and read by the Java client's own request classes, over a
 *  plain socket to the bootstrap broker (a PLAINTEXT listener). */
final class LegacyAlterConfigs {
    private static final short VERSION = 2;

    private LegacyAlterConfigs() {
    }

    /** Replaces the resource's configs with `configs`: the answer's error for it. */
    static ApiError alter(String bootstrap, ConfigResource resource, Map<String, String> configs,
                          boolean validateOnly) throws Exception {
        List<AlterConfigsRequest.ConfigEntry> entries = new ArrayList<>();
        configs.forEach((name, value) -> entries.add(new AlterConfigsRequest.ConfigEntry(name, value)));
        AlterConfigsRequest request = new AlterConfigsRequest.Builder(
                Map.of(resource, new AlterConfigsRequest.Config(entries)), validateOnly).build(VERSION);
        RequestHeader header = new RequestHeader(ApiKeys.ALTER_CONFIGS, VERSION, "clients-check", 1);
        ByteBuffer frame = request.serializeWithHeader(header);
        String[] hostPort = bootstrap.split(",")[0].split(":");
        try (Socket socket = new Socket(hostPort[0], Integer.parseInt(hostPort[1]))) {
            socket.setSoTimeout((int) Clients.WAIT.toMillis());
            DataOutputStream out = new DataOutputStream(socket.getOutputStream());
            out.writeInt(frame.remaining());
            out.write(frame.array(), frame.arrayOffset() + frame.position(), frame.remaining());
            out.flush();
            DataInputStream in = new DataInputStream(socket.getInputStream());
            byte[] answer = new byte[in.readInt()];
            in.readFully(answer);
            AlterConfigsResponse response = (AlterConfigsResponse)
                    AbstractResponse.parseResponse(ByteBuffer.wrap(answer), header);
            return response.errors().get(resource);
        }
    }
}
