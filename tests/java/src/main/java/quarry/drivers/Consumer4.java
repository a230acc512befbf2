package quarry.drivers;

import com.alibaba.fastjson.JSON;
import com.alibaba.fastjson.JSONArray;
import com.alibaba.fastjson.JSONObject;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.MessageSelector;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueAveragely;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.consumer.store.ReadOffsetType;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.impl.consumer.ProcessQueue;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.common.protocol.heartbeat.MessageModel;

/**
 * RocketMQ 4.9.8's consumers (DefaultMQPushConsumer concurrently and orderly, clustering and
 * broadcasting; DefaultLitePullConsumer with assign and seek) and a DefaultMQProducer, driven by
 * a JSON plan on stdin; one JVM for a scenario group. Steps run in order:
 *
 * <pre>
 * {"namesrv": "127.0.0.1:9876", "steps": [
 *   {"op": "send", "group": "PG", "messages": [{"topic", "tags", "keys": [..], "props": {..}, "body" | "bodyBytes": n,
 *                                              "orderKey": "o1" (a queue chosen by its hash, as an orderly producer does)}]},
 *   {"op": "push", "name": "c1", "group": "G", "subscriptions": {"T": "TagA || TagB"}, "sql": {"T": "a > 1"},
 *    "model": "CLUSTERING|BROADCASTING", "orderly": false, "maxReconsumeTimes": 2,
 *    "fail": {"<first key>": {"times": 1, "delayLevel": 0}}, "hold": ["<first key>"]},
 *                      (a held message's listener waits for "release": consumed, its offset not yet committed)
 *   {"op": "await", "consumers": ["c1"], "keys": [..], "timeoutMs": 30000},   every key consumed (successfully) by each one
 *   {"op": "awaitAny", "consumers": ["c1", "c2"], "keys": [..]},            every key consumed by one of them
 *   {"op": "awaitDeliveries", "consumer": "c1", "key": "k", "count": 3},     k delivered 3 times (failed or not)
 *   {"op": "settle", "consumers": ["c1", "c2"], "topic": "T"},             their queues of T disjoint and covering T
 *   {"op": "committed", "consumer": "c1", "topic": "T"},                  its offsets of T at each queue's end
 *   {"op": "shutdown", "consumers": ["c1"]},
 *   {"op": "pull", "group": "G", "topic": "T", "seeks": [{"brokerName", "queueId", "offset"}], "expect": n},
 *   {"op": "maxOffset", "consumer": "c1", "topic": "T"},                 the consumer asks each queue's max offset
 *   {"op": "release"},                                                    every held listener returns
 *   {"op": "awaitRoute", "topic": "T", "brokers": 2},                     the NameServer routes T on that many brokers
 *   {"op": "commitSync", "consumer": "c1", "topic": "T"},                 its offsets of T sent to the brokers, each answered
 *   {"op": "mqadmin", "commands": [["consumerProgress", "-n", ..], ..]}]}  mqadmin (MQAdminStartup) in this JVM, the consumers live
 * </pre>
 *
 * With "accessKey" and "secretKey" (the plan's, or a send or push step's own), every request
 * of that producer or consumer is signed by AclClientRPCHook.
 *
 * Prints JSON lines: {"sent"...} per message sent, {"consumed"...} per delivery to a listener
 * (its result "OK" or "FAIL"), {"started"} or {"startError", "code", "error"}, {"awaited"...},
 * {"settled"...}, {"committed"...}, {"polled"...}, {"maxOffset"...}, {"commitSync"...}, {"mqadmin"...} per command
 * (as MqAdmin prints it), then {"done": true}; a send
 * refused prints {"sent", "error", "code", "codeName"}.
 */
public final class Consumer4 {
    private static final Map<String, Object> CONSUMERS = new ConcurrentHashMap<>();
    private static final Map<String, Set<String>> OK_KEYS = new ConcurrentHashMap<>();
    private static final Map<String, AtomicInteger> FAILURES = new ConcurrentHashMap<>();
    private static final Map<String, AtomicInteger> DELIVERIES = new ConcurrentHashMap<>();
    private static final JSONObject PLAN = new JSONObject();
    private static final java.util.concurrent.CountDownLatch RELEASE = new java.util.concurrent.CountDownLatch(1);

    private Consumer4() {
    }

    public static void main(String[] args) throws Exception {
        JSONObject plan = JSON.parseObject(Producer4.readAll(System.in));
        String namesrv = plan.getString("namesrv");
        PLAN.putAll(plan);
        JSONArray steps = plan.getJSONArray("steps");
        try {
            for (int i = 0; i < steps.size(); i++) {
                JSONObject step = steps.getJSONObject(i);
                switch (step.getString("op")) {
                    case "send": send(namesrv, step); break;
                    case "push": push(namesrv, step); break;
                    case "await": await(step, false); break;
                    case "awaitAny": await(step, true); break;
                    case "awaitDeliveries": awaitDeliveries(step); break;
                    case "settle": settle(step); break;
                    case "committed": committed(step); break;
                    case "shutdown": shutdown(step.getJSONArray("consumers").toJavaList(String.class)); break;
                    case "pull": pull(namesrv, step); break;
                    case "maxOffset": maxOffset(step); break;
                    case "release": RELEASE.countDown(); break;
                    case "awaitRoute": awaitRoute(namesrv, step); break;
                    case "commitSync": commitSync(step); break;
                    case "mqadmin":
                        for (Object c : step.getJSONArray("commands")) {
                            Map<String, Object> line = new LinkedHashMap<>(MqAdmin.run(((JSONArray) c).toJavaList(String.class), 30000, "mqadmin"));
                            line.put("mqadmin", line.remove("args"));
                            Producer4.emit(line);
                        }
                        break;
                    default: throw new IllegalArgumentException("unknown op " + step.getString("op"));
                }
            }
        } finally {
            RELEASE.countDown();
            shutdown(new ArrayList<>(CONSUMERS.keySet()));
        }
        Producer4.emit(Map.of("done", true));
        System.out.flush();
        System.exit(0);
    }

    /** AclClientRPCHook with the step's credentials, else the plan's, else null. */
    private static org.apache.rocketmq.remoting.RPCHook aclHook(JSONObject step) {
        return Producer4.aclHook(step.containsKey("accessKey") ? step : PLAN);
    }

    private static long timeout(JSONObject step) {
        return step.containsKey("timeoutMs") ? step.getLongValue("timeoutMs") : 30000;
    }

    // -- producing ------------------------------------------------------------------------------
    private static void send(String namesrv, JSONObject step) throws Exception {
        DefaultMQProducer producer = new DefaultMQProducer(step.getString("group"), aclHook(step));
        producer.setNamesrvAddr(namesrv);
        producer.setInstanceName("producer-" + ProcessHandle.current().pid() + "-" + step.getString("group"));
        producer.setSendMsgTimeout(15000);
        producer.start();
        try {
            JSONArray specs = step.getJSONArray("messages");
            for (int i = 0; i < specs.size(); i++) {
                JSONObject spec = specs.getJSONObject(i);
                byte[] body = spec.containsKey("bodyBytes") ? pattern(spec.getIntValue("bodyBytes"))
                    : spec.getString("body").getBytes(StandardCharsets.UTF_8);
                Message msg = new Message(spec.getString("topic"), spec.getString("tags"), body);
                msg.setKeys(spec.getJSONArray("keys").toJavaList(String.class));
                JSONObject props = spec.getJSONObject("props");
                if (props != null) {
                    for (String k : props.keySet()) {
                        msg.putUserProperty(k, props.getString(k));
                    }
                }
                SendResult r;
                String orderKey = spec.getString("orderKey");
                try {
                    if (orderKey != null) {
                        r = producer.send(msg, (mqs, m, arg) -> mqs.get(Math.abs(arg.hashCode() % mqs.size())), orderKey);
                    } else {
                        r = producer.send(msg);
                    }
                } catch (Exception e) {
                    if (!step.getBooleanValue("mayFail")) {
                        throw e;
                    }
                    Map<String, Object> line = new LinkedHashMap<>();
                    line.put("sent", msg.getKeys().split(" ")[0]);
                    line.put("error", e.getClass().getName() + ": " + e.getMessage());
                    Producer4.putCode(line, e);
                    Producer4.emit(line);
                    continue;
                }
                Map<String, Object> line = new LinkedHashMap<>();
                line.put("sent", msg.getKeys().split(" ")[0]);
                line.put("status", r.getSendStatus().name());
                line.put("msgId", r.getMsgId());
                line.put("offsetMsgId", r.getOffsetMsgId());
                line.put("topic", msg.getTopic());
                line.put("brokerName", r.getMessageQueue().getBrokerName());
                line.put("queueId", r.getMessageQueue().getQueueId());
                line.put("queueOffset", r.getQueueOffset());
                line.put("bodySha256", Producer4.sha256(body));
                Producer4.emit(line);
            }
        } finally {
            producer.shutdown();
        }
    }

    private static byte[] pattern(int n) {
        byte[] b = new byte[n];
        for (int i = 0; i < n; i++) {
            b[i] = (byte) ('a' + (i * 7) % 26);
        }
        return b;
    }

    // -- push consumers -------------------------------------------------------------------------
    private static void push(String namesrv, JSONObject step) {
        String name = step.getString("name");
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(step.getString("group"), aclHook(step), new AllocateMessageQueueAveragely());
        consumer.setNamesrvAddr(namesrv);
        consumer.setInstanceName(step.getString("instance") != null ? step.getString("instance") : "consumer-" + name);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setMessageModel(MessageModel.valueOf(step.getString("model") != null ? step.getString("model") : "CLUSTERING"));
        consumer.setConsumeThreadMin(2);
        consumer.setConsumeThreadMax(4);
        consumer.setPollNameServerInterval(1000);  // new routes (a group's retry topic, made by its first heartbeat) within a second
        consumer.setAwaitTerminationMillisWhenShutdown(5000);  // consumption in progress ends (and is committed) before shutdown
        if (step.containsKey("maxReconsumeTimes")) {
            consumer.setMaxReconsumeTimes(step.getIntValue("maxReconsumeTimes"));
        }
        JSONObject fail = step.getJSONObject("fail") != null ? step.getJSONObject("fail") : new JSONObject();
        Set<String> hold = step.containsKey("hold") ? new HashSet<>(step.getJSONArray("hold").toJavaList(String.class)) : Set.of();
        OK_KEYS.putIfAbsent(name, ConcurrentHashMap.newKeySet());
        try {
            JSONObject subs = step.getJSONObject("subscriptions");
            if (subs != null) {
                for (String topic : subs.keySet()) {
                    consumer.subscribe(topic, subs.getString(topic));
                }
            }
            JSONObject sql = step.getJSONObject("sql");
            if (sql != null) {
                for (String topic : sql.keySet()) {
                    consumer.subscribe(topic, MessageSelector.bySql(sql.getString(topic)));
                }
            }
            if (step.getBooleanValue("orderly")) {
                consumer.registerMessageListener((MessageListenerOrderly) (msgs, ctx) -> {
                    for (MessageExt m : msgs) {
                        consumed(name, m, "OK");
                    }
                    return ConsumeOrderlyStatus.SUCCESS;
                });
            } else {
                consumer.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                    for (MessageExt m : msgs) {
                        if (hold.contains(firstKey(m)) && RELEASE.getCount() > 0) {
                            consumed(name, m, "HELD");
                            try {
                                RELEASE.await();
                            } catch (InterruptedException e) {
                                Thread.currentThread().interrupt();
                            }
                        }
                    }
                    boolean failed = false;
                    for (MessageExt m : msgs) {
                        JSONObject rule = fail.getJSONObject(firstKey(m));
                        if (rule != null) {
                            AtomicInteger n = FAILURES.computeIfAbsent(name + "/" + firstKey(m), k -> new AtomicInteger());
                            if (n.getAndIncrement() < rule.getIntValue("times")) {
                                failed = true;
                                if (rule.containsKey("delayLevel")) {
                                    ctx.setDelayLevelWhenNextConsume(rule.getIntValue("delayLevel"));
                                }
                            }
                        }
                    }
                    for (MessageExt m : msgs) {
                        consumed(name, m, failed ? "FAIL" : "OK");
                    }
                    return failed ? ConsumeConcurrentlyStatus.RECONSUME_LATER : ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
                });
            }
            consumer.start();
            CONSUMERS.put(name, consumer);
            Producer4.emit(Map.of("started", name, "clientId", consumer.buildMQClientId()));
        } catch (MQClientException e) {
            consumer.shutdown();
            Map<String, Object> line = new LinkedHashMap<>();
            line.put("startError", name);
            line.put("code", e.getResponseCode());
            line.put("remark", e.getErrorMessage());
            line.put("error", e.getMessage());
            Producer4.emit(line);
        }
    }

    private static String firstKey(MessageExt m) {
        String keys = m.getKeys();
        return keys == null ? "" : keys.split(" ")[0];
    }

    private static void consumed(String name, MessageExt m, String result) {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("consumed", name);
        line.put("key", firstKey(m));
        line.put("result", result);
        line.put("msgId", m.getMsgId());
        line.put("topic", m.getTopic());
        line.put("tags", m.getTags());
        line.put("brokerName", m.getBrokerName());
        line.put("queueId", m.getQueueId());
        line.put("queueOffset", m.getQueueOffset());
        line.put("reconsumeTimes", m.getReconsumeTimes());
        line.put("storeTimestamp", m.getStoreTimestamp());
        line.put("at", System.currentTimeMillis());
        line.put("thread", Thread.currentThread().getName());
        line.put("bodySha256", Producer4.sha256(m.getBody()));
        line.put("props", new TreeMap<>(m.getProperties()));
        Producer4.emit(line);
        DELIVERIES.computeIfAbsent(name + "/" + firstKey(m), k -> new AtomicInteger()).incrementAndGet();
        if ("OK".equals(result)) {
            OK_KEYS.computeIfAbsent(name, k -> ConcurrentHashMap.newKeySet()).add(firstKey(m));
        }
    }

    private static void await(JSONObject step, boolean any) throws InterruptedException {
        List<String> names = step.getJSONArray("consumers").toJavaList(String.class);
        List<String> keys = step.getJSONArray("keys").toJavaList(String.class);
        long deadline = System.currentTimeMillis() + timeout(step);
        Set<String> missing;
        while (true) {
            missing = new TreeSet<>();
            for (String key : keys) {
                if (any) {
                    if (names.stream().noneMatch(n -> OK_KEYS.getOrDefault(n, Set.of()).contains(key))) {
                        missing.add(key);
                    }
                } else {
                    for (String n : names) {
                        if (!OK_KEYS.getOrDefault(n, Set.of()).contains(key)) {
                            missing.add(n + ":" + key);
                        }
                    }
                }
            }
            if (missing.isEmpty() || System.currentTimeMillis() > deadline) {
                break;
            }
            Thread.sleep(50);
        }
        Producer4.emit(Map.of("awaited", names, "ok", missing.isEmpty(), "missing", missing));
    }

    private static void awaitDeliveries(JSONObject step) throws InterruptedException {
        String id = step.getString("consumer") + "/" + step.getString("key");
        int want = step.getIntValue("count");
        long deadline = System.currentTimeMillis() + timeout(step);
        while (DELIVERIES.getOrDefault(id, new AtomicInteger()).get() < want && System.currentTimeMillis() < deadline) {
            Thread.sleep(50);
        }
        int got = DELIVERIES.getOrDefault(id, new AtomicInteger()).get();
        Producer4.emit(Map.of("awaited", id, "ok", got >= want, "deliveries", got));
    }

    private static Map<MessageQueue, ProcessQueue> queues(String name) {
        DefaultMQPushConsumer c = (DefaultMQPushConsumer) CONSUMERS.get(name);
        return c.getDefaultMQPushConsumerImpl().getRebalanceImpl().getProcessQueueTable();
    }

    /** Waits until the consumers' live queues of the topic are disjoint, cover every queue of it and,
     *  with at least as many queues as consumers, each consumer holds one (a consumer that has not
     *  rebalanced yet holds none while the others still hold everything). */
    private static void settle(JSONObject step) throws Exception {
        List<String> names = step.getJSONArray("consumers").toJavaList(String.class);
        String topic = step.getString("topic");
        Set<MessageQueue> all = ((DefaultMQPushConsumer) CONSUMERS.get(names.get(0))).fetchSubscribeMessageQueues(topic);
        long deadline = System.currentTimeMillis() + timeout(step);
        Map<String, List<String>> held;
        boolean ok;
        while (true) {
            held = new TreeMap<>();
            Set<MessageQueue> union = new HashSet<>();
            int total = 0;
            for (String n : names) {
                List<String> mine = new ArrayList<>();
                for (Map.Entry<MessageQueue, ProcessQueue> e : queues(n).entrySet()) {
                    if (e.getKey().getTopic().equals(topic) && !e.getValue().isDropped()) {
                        mine.add(e.getKey().getBrokerName() + "/" + e.getKey().getQueueId());
                        union.add(e.getKey());
                        total++;
                    }
                }
                mine.sort(null);
                held.put(n, mine);
            }
            boolean everyoneHolds = all.size() < names.size() || held.values().stream().noneMatch(List::isEmpty);
            ok = union.equals(all) && total == all.size() && everyoneHolds;
            if (ok || System.currentTimeMillis() > deadline) {
                break;
            }
            Thread.sleep(50);
        }
        Producer4.emit(Map.of("settled", ok, "topic", topic, "queues", all.size(), "held", held));
    }

    /** Waits until the consumer's offsets of the topic (as it will commit them) reach each queue's end. */
    private static void committed(JSONObject step) throws Exception {
        String name = step.getString("consumer");
        String topic = step.getString("topic");
        DefaultMQPushConsumer c = (DefaultMQPushConsumer) CONSUMERS.get(name);
        long deadline = System.currentTimeMillis() + timeout(step);
        Map<String, Long> offsets;
        boolean ok;
        while (true) {
            offsets = new TreeMap<>();
            ok = true;
            for (MessageQueue mq : c.fetchSubscribeMessageQueues(topic)) {
                long at = c.getOffsetStore().readOffset(mq, ReadOffsetType.READ_FROM_MEMORY);
                long end = c.maxOffset(mq);
                offsets.put(mq.getBrokerName() + "/" + mq.getQueueId(), at);
                ok &= at == end || (end == 0 && at <= 0);
            }
            if (ok || System.currentTimeMillis() > deadline) {
                break;
            }
            Thread.sleep(50);
        }
        Producer4.emit(Map.of("committed", name, "ok", ok, "offsets", offsets));
    }

    private static void shutdown(Collection<String> names) {
        for (String n : names) {
            Object c = CONSUMERS.remove(n);
            if (c instanceof DefaultMQPushConsumer) {
                ((DefaultMQPushConsumer) c).shutdown();
                Producer4.emit(Map.of("shutdown", n));
            }
        }
    }

    /** The consumer's own admin call (GET_MAX_OFFSET to each queue's broker), answered or refused. */
    private static void maxOffset(JSONObject step) throws Exception {
        String name = step.getString("consumer");
        String topic = step.getString("topic");
        DefaultMQPushConsumer c = (DefaultMQPushConsumer) CONSUMERS.get(name);
        Map<String, Object> offsets = new TreeMap<>();
        // the topic's queues from the NameServer (the consumer's own table holds only its subscriptions')
        for (MessageQueue mq : c.getDefaultMQPushConsumerImpl().getmQClientFactory().getMQAdminImpl().fetchSubscribeMessageQueues(topic)) {
            String q = mq.getBrokerName() + "/" + mq.getQueueId();
            try {
                offsets.put(q, c.maxOffset(mq));
            } catch (MQClientException e) {
                Map<String, Object> err = new LinkedHashMap<>();
                err.put("error", e.getMessage());
                Producer4.putCode(err, e);
                offsets.put(q, err);
            }
        }
        Producer4.emit(Map.of("maxOffset", name, "topic", topic, "queues", offsets));
    }

    /** The consumer's offsets of the topic, as it holds them, sent to their brokers and answered
     * (UPDATE_CONSUMER_OFFSET, not the one-way send of its periodic persist). */
    private static void commitSync(JSONObject step) throws Exception {
        String name = step.getString("consumer");
        String topic = step.getString("topic");
        DefaultMQPushConsumer c = (DefaultMQPushConsumer) CONSUMERS.get(name);
        org.apache.rocketmq.client.consumer.store.RemoteBrokerOffsetStore store =
            (org.apache.rocketmq.client.consumer.store.RemoteBrokerOffsetStore) c.getOffsetStore();
        Map<String, Long> offsets = new TreeMap<>();
        for (MessageQueue mq : c.fetchSubscribeMessageQueues(topic)) {
            long at = store.readOffset(mq, ReadOffsetType.READ_FROM_MEMORY);
            if (at >= 0) {
                store.updateConsumeOffsetToBroker(mq, at, false);
                offsets.put(mq.getBrokerName() + "/" + mq.getQueueId(), at);
            }
        }
        Producer4.emit(Map.of("commitSync", name, "topic", topic, "offsets", offsets));
    }

    /** Waits until the NameServer's route of the topic names that many brokers. */
    private static void awaitRoute(String namesrv, JSONObject step) throws Exception {
        String topic = step.getString("topic");
        int want = step.getIntValue("brokers");
        DefaultMQProducer probe = new DefaultMQProducer("route-probe-" + ProcessHandle.current().pid(), aclHook(step));
        probe.setNamesrvAddr(namesrv);
        probe.setInstanceName("route-probe");
        probe.start();
        long deadline = System.currentTimeMillis() + timeout(step);
        int got = 0;
        try {
            while (System.currentTimeMillis() < deadline) {
                try {
                    got = probe.getDefaultMQProducerImpl().getmQClientFactory().getMQClientAPIImpl()
                        .getTopicRouteInfoFromNameServer(topic, 3000).getBrokerDatas().size();
                } catch (MQClientException e) {
                    got = 0;  // no route yet
                }
                if (got >= want) {
                    break;
                }
                Thread.sleep(50);
            }
        } finally {
            probe.shutdown();
        }
        Producer4.emit(Map.of("routed", topic, "ok", got >= want, "brokers", got));
    }

    // -- lite pull consumer, assign and seek ----------------------------------------------------
    private static void pull(String namesrv, JSONObject step) throws Exception {
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(step.getString("group"));
        consumer.setNamesrvAddr(namesrv);
        consumer.setInstanceName("lite-" + step.getString("group"));
        consumer.setAutoCommit(false);
        consumer.start();
        try {
            String topic = step.getString("topic");
            List<MessageQueue> all = new ArrayList<>(consumer.fetchMessageQueues(topic));
            consumer.assign(all);
            Map<String, Object> assigned = new LinkedHashMap<>();
            assigned.put("assigned", all.size());
            Producer4.emit(assigned);
            JSONArray rounds = step.getJSONArray("rounds");
            for (int r = 0; r < rounds.size(); r++) {
                JSONObject round = rounds.getJSONObject(r);
                Map<String, Long> seeks = new HashMap<>();
                for (Object o : round.getJSONArray("seeks")) {
                    JSONObject s = (JSONObject) o;
                    seeks.put(s.getString("brokerName") + "/" + s.getIntValue("queueId"), s.getLong("offset"));
                }
                for (MessageQueue mq : all) {
                    Long to = seeks.get(mq.getBrokerName() + "/" + mq.getQueueId());
                    try {
                        if (to == null) {
                            consumer.seekToEnd(mq);
                        } else {
                            consumer.seek(mq, to);
                        }
                    } catch (MQClientException e) {
                        Producer4.emit(Map.of("round", r, "seekError", mq.getBrokerName() + "/" + mq.getQueueId(), "error", String.valueOf(e.getErrorMessage())));
                    }
                }
                int expect = round.getIntValue("expect");
                long deadline = System.currentTimeMillis() + timeout(step);
                int got = 0;
                while (got < expect && System.currentTimeMillis() < deadline) {
                    for (MessageExt m : consumer.poll(500)) {
                        Map<String, Object> line = new LinkedHashMap<>();
                        line.put("polled", firstKey(m));
                        line.put("round", r);
                        line.put("brokerName", m.getBrokerName());
                        line.put("queueId", m.getQueueId());
                        line.put("queueOffset", m.getQueueOffset());
                        Producer4.emit(line);
                        got++;
                    }
                }
                // Anything more than expected (nothing should come: every other queue is at its end).
                for (MessageExt m : consumer.poll(300)) {
                    Producer4.emit(Map.of("polled", firstKey(m), "round", r, "extra", true, "queueOffset", m.getQueueOffset()));
                }
            }
        } finally {
            consumer.shutdown();
        }
    }
}
