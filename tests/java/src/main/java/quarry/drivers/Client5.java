package quarry.drivers;

import java.io.ByteArrayOutputStream;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CompletableFuture;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientConfigurationBuilder;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.StaticSessionCredentialsProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.PushConsumer;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.message.MessageBuilder;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.SendReceipt;
import org.apache.rocketmq.client.apis.producer.Transaction;
import org.apache.rocketmq.client.apis.producer.TransactionResolution;
// rocketmq-client-java shades gson; the 5.x classpath holds that jar alone (tests/e2e/java.py).
import org.apache.rocketmq.shaded.com.google.gson.Gson;
import org.apache.rocketmq.shaded.com.google.gson.GsonBuilder;
import org.apache.rocketmq.shaded.com.google.gson.JsonArray;
import org.apache.rocketmq.shaded.com.google.gson.JsonElement;
import org.apache.rocketmq.shaded.com.google.gson.JsonObject;
import org.apache.rocketmq.shaded.com.google.gson.JsonParser;

/**
 * rocketmq-client-java 5.x (the gRPC client) driven by a JSON plan on stdin, every step in one JVM.
 *
 * <pre>
 * {"endpoints": "127.0.0.1:8081", "requestTimeoutMs": 5000, "accessKey": "", "secretKey": "",
 *  "topics": ["T"],            // the producer's topics (prefetched routes)
 *  "steps": [
 *   {"op": "send", "topic": "T", "async": false, "messages": [{"name": "n", "tag": "A", "keys": ["k"],
 *       "props": {"p": "v"}, "body": "text", "group": "fifo group", "deliverInMs": 2000}]},
 *   {"op": "transaction", "topic": "T", "resolution": "commit|rollback|none", "message": {...}},
 *   {"op": "simple", "group": "G", "topic": "T", "expression": "*", "want": 10, "invisibleMs": 20000,
 *       "awaitMs": 2000, "deadlineMs": 30000, "changeInvisible": {"names": ["n"], "toMs": 1000}},
 *   {"op": "push", "group": "G", "topic": "T", "expression": "*", "want": 10, "deadlineMs": 30000,
 *       "failOnce": ["n"]},
 *   {"op": "awaitChecks", "deadlineMs": 10000}]}
 * </pre>
 * A step may carry "accessKey"/"secretKey" of its own (ACL tests). Prints one JSON line per
 * event: {"op": "sent", "name", "messageId"} or {"op": "sent", "name", "error", "errorClass"};
 * {"op": "received"|"consumed", "messageId", "name", "attempt", "tag", "keys", "props", "group",
 * "deliveryTimestamp", "bodySha256", "body"}; {"op": "invisibleChanged", "messageId"};
 * {"op": "checked", "messageId", "name"} (the TransactionChecker asked); {"op": "stepError",
 * "step", "error", "errorClass"}; then {"done": true}.
 */
public final class Client5 {
    private static final Gson GSON = new GsonBuilder().serializeNulls().disableHtmlEscaping().create();
    private static final ClientServiceProvider PROVIDER = ClientServiceProvider.loadService();
    private static final Map<String, String> CHECKED = new ConcurrentHashMap<>(); // message id -> name
    private static final Set<String> ORPHANS = ConcurrentHashMap.newKeySet();

    private Client5() {
    }

    public static void main(String[] args) throws Exception {
        JsonObject plan = JsonParser.parseString(readAll(System.in)).getAsJsonObject();
        Map<String, Producer> producers = new HashMap<>();
        try {
            JsonArray steps = plan.getAsJsonArray("steps");
            for (int s = 0; s < steps.size(); s++) {
                JsonObject step = steps.get(s).getAsJsonObject();
                long started = System.currentTimeMillis();
                try {
                    run(plan, step, producers);
                    emit(Map.of("op", "stepDone", "step", s, "ms", System.currentTimeMillis() - started));
                } catch (Throwable e) {
                    Map<String, Object> line = new LinkedHashMap<>();
                    line.put("op", "stepError");
                    line.put("step", s);
                    failed(line, e);
                    emit(line);
                }
            }
        } finally {
            for (Producer p : producers.values()) {
                p.close();
            }
        }
        emit(Map.of("done", true));
        System.out.flush();
        System.exit(0);
    }

    private static String str(JsonObject o, String name, String dflt) {
        JsonElement e = o.get(name);
        return e == null || e.isJsonNull() ? dflt : e.getAsString();
    }

    private static long num(JsonObject o, String name, long dflt) {
        JsonElement e = o.get(name);
        return e == null || e.isJsonNull() ? dflt : e.getAsLong();
    }

    private static ClientConfiguration configuration(JsonObject plan, JsonObject step) {
        ClientConfigurationBuilder b = ClientConfiguration.newBuilder()
            .setEndpoints(plan.get("endpoints").getAsString())
            .enableSsl(false)
            .setRequestTimeout(Duration.ofMillis(num(plan, "requestTimeoutMs", 5000)));
        String ak = str(step, "accessKey", str(plan, "accessKey", ""));
        if (!ak.isEmpty()) {
            b.setCredentialProvider(new StaticSessionCredentialsProvider(ak, str(step, "secretKey", str(plan, "secretKey", ""))));
        }
        return b.build();
    }

    private static Producer producer(JsonObject plan, JsonObject step, Map<String, Producer> producers) throws Exception {
        String ak = str(step, "accessKey", str(plan, "accessKey", "")) + "\n" + str(step, "secretKey", str(plan, "secretKey", ""));
        Producer p = producers.get(ak);
        if (p == null) {
            List<String> topics = new ArrayList<>();
            if (plan.has("topics")) {
                plan.getAsJsonArray("topics").forEach(t -> topics.add(t.getAsString()));
            }
            p = PROVIDER.newProducerBuilder().setClientConfiguration(configuration(plan, step))
                .setTopics(topics.toArray(new String[0]))
                .setTransactionChecker(view -> {
                    String id = view.getMessageId().toString();
                    CHECKED.put(id, view.getProperties().getOrDefault("name", ""));
                    Map<String, Object> line = new LinkedHashMap<>();
                    line.put("op", "checked");
                    line.put("messageId", id);
                    line.put("name", view.getProperties().get("name"));
                    emit(line);
                    return TransactionResolution.COMMIT;
                })
                .build();
            producers.put(ak, p);
        }
        return p;
    }

    private static Message message(String topic, JsonObject spec) {
        MessageBuilder b = PROVIDER.newMessageBuilder().setTopic(topic)
            .setBody(str(spec, "body", "").getBytes(StandardCharsets.UTF_8));
        String name = str(spec, "name", "");
        if (!name.isEmpty()) {
            b.addProperty("name", name);
        }
        if (spec.has("tag")) {
            b.setTag(spec.get("tag").getAsString());
        }
        if (spec.has("keys")) {
            List<String> keys = new ArrayList<>();
            spec.getAsJsonArray("keys").forEach(k -> keys.add(k.getAsString()));
            b.setKeys(keys.toArray(new String[0]));
        }
        if (spec.has("props")) {
            for (Map.Entry<String, JsonElement> e : spec.getAsJsonObject("props").entrySet()) {
                b.addProperty(e.getKey(), e.getValue().getAsString());
            }
        }
        if (spec.has("group")) {
            b.setMessageGroup(spec.get("group").getAsString());
        }
        if (spec.has("deliverInMs")) {
            b.setDeliveryTimestamp(System.currentTimeMillis() + spec.get("deliverInMs").getAsLong());
        }
        return b.build();
    }

    private static void run(JsonObject plan, JsonObject step, Map<String, Producer> producers) throws Exception {
        switch (step.get("op").getAsString()) {
            case "send":
                send(producer(plan, step, producers), step);
                break;
            case "transaction":
                transaction(producer(plan, step, producers), step);
                break;
            case "simple":
                simple(plan, step);
                break;
            case "push":
                push(plan, step);
                break;
            case "awaitChecks":
                long end = System.currentTimeMillis() + num(step, "deadlineMs", 10000);
                while (!CHECKED.keySet().containsAll(ORPHANS) && System.currentTimeMillis() < end) {
                    Thread.sleep(50);  // polling the checker's record until the deadline
                }
                Map<String, Object> line = new LinkedHashMap<>();
                line.put("op", "checks");
                line.put("orphans", new ArrayList<>(ORPHANS));
                line.put("checked", new ArrayList<>(CHECKED.keySet()));
                emit(line);
                break;
            default:
                throw new IllegalArgumentException("unknown op " + step.get("op"));
        }
    }

    private static Map<String, Object> sent(String name, String topic) {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("op", "sent");
        line.put("name", name);
        line.put("topic", topic);
        return line;
    }

    /** The error's class and message: the innermost cause's (a client that fails to start wraps it), the chain in "chain". */
    private static void failed(Map<String, Object> line, Throwable e) {
        List<String> chain = new ArrayList<>();
        Throwable cause = e;
        for (Throwable t = e; t != null && chain.size() < 8; t = t.getCause()) {
            chain.add(t.getClass().getSimpleName() + ": " + t.getMessage());
            cause = t;
        }
        line.put("errorClass", cause.getClass().getSimpleName());
        line.put("error", String.valueOf(cause.getMessage()));
        line.put("chain", chain);
    }

    private static void send(Producer producer, JsonObject step) {
        String topic = step.get("topic").getAsString();
        boolean async = step.has("async") && step.get("async").getAsBoolean();
        JsonArray specs = step.getAsJsonArray("messages");
        List<Map<String, Object>> lines = new ArrayList<>();
        List<CompletableFuture<SendReceipt>> futures = new ArrayList<>();
        for (int i = 0; i < specs.size(); i++) {
            JsonObject spec = specs.get(i).getAsJsonObject();
            Map<String, Object> line = sent(str(spec, "name", ""), topic);
            line.put("async", async);
            lines.add(line);
            try {
                Message m = message(topic, spec);
                if (async) {
                    futures.add(producer.sendAsync(m));
                } else {
                    line.put("messageId", producer.send(m).getMessageId().toString());
                    futures.add(null);
                }
            } catch (Throwable e) {
                failed(line, e);
                futures.add(null);
            }
        }
        for (int i = 0; i < lines.size(); i++) {
            if (futures.get(i) != null) {
                try {
                    lines.get(i).put("messageId", futures.get(i).get().getMessageId().toString());
                } catch (Throwable e) {
                    failed(lines.get(i), e);
                }
            }
            emit(lines.get(i));
        }
    }

    private static void transaction(Producer producer, JsonObject step) {
        String topic = step.get("topic").getAsString();
        JsonObject spec = step.getAsJsonObject("message");
        String resolution = step.get("resolution").getAsString();
        Map<String, Object> line = sent(str(spec, "name", ""), topic);
        line.put("resolution", resolution);
        try {
            Transaction tx = producer.beginTransaction();
            SendReceipt r = producer.send(message(topic, spec), tx);
            String id = r.getMessageId().toString();
            line.put("messageId", id);
            if (resolution.equals("commit")) {
                tx.commit();
            } else if (resolution.equals("rollback")) {
                tx.rollback();
            } else {
                ORPHANS.add(id);  // left to the server's check (TransactionChecker)
            }
        } catch (Throwable e) {
            failed(line, e);
        }
        emit(line);
    }

    private static Map<String, FilterExpression> subscription(JsonObject step) {
        return Map.of(step.get("topic").getAsString(), new FilterExpression(str(step, "expression", "*"), FilterExpressionType.TAG));
    }

    private static Map<String, Object> view(String op, MessageView v) {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("op", op);
        line.put("messageId", v.getMessageId().toString());
        line.put("topic", v.getTopic());
        line.put("name", v.getProperties().get("name"));
        line.put("attempt", v.getDeliveryAttempt());
        line.put("tag", v.getTag().orElse(null));
        line.put("keys", new ArrayList<>(v.getKeys()));
        line.put("group", v.getMessageGroup().orElse(null));
        line.put("deliveryTimestamp", v.getDeliveryTimestamp().orElse(null));
        line.put("props", new HashMap<>(v.getProperties()));
        ByteBuffer body = v.getBody().duplicate();
        byte[] bytes = new byte[body.remaining()];
        body.get(bytes);
        line.put("body", new String(bytes, StandardCharsets.UTF_8));
        line.put("bodySha256", sha256(bytes));
        line.put("receivedAtMs", System.currentTimeMillis());
        return line;
    }

    private static void simple(JsonObject plan, JsonObject step) throws Exception {
        int want = (int) num(step, "want", 1);
        long end = System.currentTimeMillis() + num(step, "deadlineMs", 30000);
        Duration invisible = Duration.ofMillis(num(step, "invisibleMs", 20000));
        List<String> change = new ArrayList<>();
        long toMs = 1000;
        if (step.has("changeInvisible")) {
            step.getAsJsonObject("changeInvisible").getAsJsonArray("names").forEach(n -> change.add(n.getAsString()));
            toMs = num(step.getAsJsonObject("changeInvisible"), "toMs", 1000);
        }
        Set<String> acked = new java.util.HashSet<>();
        try (SimpleConsumer consumer = PROVIDER.newSimpleConsumerBuilder().setClientConfiguration(configuration(plan, step))
                 .setConsumerGroup(step.get("group").getAsString()).setSubscriptionExpressions(subscription(step))
                 .setAwaitDuration(Duration.ofMillis(num(step, "awaitMs", 2000))).build()) {
            while (acked.size() < want && System.currentTimeMillis() < end) {
                for (MessageView v : consumer.receive(16, invisible)) {
                    Map<String, Object> line = view("received", v);
                    String name = String.valueOf(v.getProperties().get("name"));
                    if (change.remove(name)) {  // once: hidden for toMs instead, then received again
                        consumer.changeInvisibleDuration(v, Duration.ofMillis(toMs));
                        line.put("invisibleChangedToMs", toMs);
                    } else {
                        consumer.ack(v);
                        line.put("acked", true);
                        acked.add(v.getMessageId().toString());
                    }
                    emit(line);
                }
            }
        }
    }

    private static void push(JsonObject plan, JsonObject step) throws Exception {
        int want = (int) num(step, "want", 1);
        long end = System.currentTimeMillis() + num(step, "deadlineMs", 30000);
        Set<String> failOnce = ConcurrentHashMap.newKeySet();
        if (step.has("failOnce")) {
            step.getAsJsonArray("failOnce").forEach(n -> failOnce.add(n.getAsString()));
        }
        Set<String> done = ConcurrentHashMap.newKeySet();
        PushConsumer consumer = PROVIDER.newPushConsumerBuilder().setClientConfiguration(configuration(plan, step))
                 .setConsumerGroup(step.get("group").getAsString()).setSubscriptionExpressions(subscription(step))
                 .setConsumptionThreadCount(4)
                 .setMessageListener(v -> {
                     Map<String, Object> line = view("consumed", v);
                     String name = String.valueOf(v.getProperties().get("name"));
                     if (failOnce.remove(name)) {
                         line.put("result", "FAILURE");
                         emit(line);
                         return ConsumeResult.FAILURE;
                     }
                     line.put("result", "SUCCESS");
                     emit(line);
                     done.add(v.getMessageId().toString());
                     return ConsumeResult.SUCCESS;
                 }).build();
        while (done.size() < want && System.currentTimeMillis() < end) {
            Thread.sleep(50);  // the listener's record, polled until the deadline
        }
        long settle = System.currentTimeMillis() + num(step, "settleMs", 0);
        while (System.currentTimeMillis() < settle) {  // a duplicate would show in this window
            Thread.sleep(50);
        }
        // close() first waits out the receives in flight (up to the server's long polling, 20 s,
        // as against RocketMQ's proxy): closed beside the next steps; the JVM's exit ends it.
        Thread closing = new Thread(() -> {
            try {
                consumer.close();
            } catch (Exception e) {
                emit(Map.of("op", "closeError", "error", String.valueOf(e)));
            }
        }, "push-consumer-close");
        closing.setDaemon(true);
        closing.start();
    }

    private static String sha256(byte[] body) {
        try {
            return HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(body));
        } catch (Exception e) {
            throw new IllegalStateException(e);
        }
    }

    private static synchronized void emit(Map<String, ?> line) {
        System.out.println(GSON.toJson(line));
        System.out.flush();
    }

    private static String readAll(InputStream in) throws Exception {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        in.transferTo(out);
        return out.toString(StandardCharsets.UTF_8);
    }
}
