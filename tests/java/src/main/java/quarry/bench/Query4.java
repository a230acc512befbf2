package quarry.bench;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.rocketmq.client.QueryResult;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.admin.TopicOffset;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

/**
 * Key, unique-key and id queries through RocketMQ 4.9.8's admin API (bench rocketmq, issue 36):
 * sends `seed` 1 KiB messages, each with a key of its own, keeps their ids, waits `settleMs` (the
 * broker's index is built behind its CommitLog), then asks one query at a time (1 thread),
 * `queries` of each kind after `warmup` unmeasured ones of each kind:
 * <ul>
 * <li>key: {@code queryMessage(topic, key, 32, 0, now + 1 h)} for a key sent, answered with its message;</li>
 * <li>key_absent: the same for a key never sent (the API answers with an MQClientException "no message");</li>
 * <li>uniq: {@code queryMessageByUniqKey(topic, msgId, ...)} for a message's unique id (its client msgId);</li>
 * <li>uniq_absent: the same for a unique id never sent;</li>
 * <li>id: {@code viewMessage(offsetMsgId)} (the id names the broker's address and the offset).</li>
 * </ul>
 *
 * <pre>java quarry.bench.Query4 namesrv topic seed queries warmup settleMs bodyBytes</pre>
 *
 * Prints one JSON line: {"seed", "wrong": {kind: n}, "latMs": {kind: [..]}}.
 */
public final class Query4 {
    private Query4() {
    }

    public static void main(String[] args) throws Exception {
        String namesrv = args[0];
        String topic = args[1];
        int seed = Integer.parseInt(args[2]);
        int queries = Integer.parseInt(args[3]);
        int warmup = Integer.parseInt(args[4]);
        long settleMs = Long.parseLong(args[5]);
        byte[] body = Bench4.body(Integer.parseInt(args[6]));
        String run = Long.toString(System.currentTimeMillis(), 36);
        long stored = storedMessages(namesrv, topic, run);
        DefaultMQProducer producer = new DefaultMQProducer("bench_query_producer");
        producer.setInstanceName("q" + run);
        producer.setNamesrvAddr(namesrv);
        producer.setCompressMsgBodyOverHowmuch(Integer.MAX_VALUE);
        producer.start();
        String[] keys = new String[seed];
        String[] uniq = new String[seed];
        String[] offsetIds = new String[seed];
        try {
            for (int i = 0; i < seed; i++) {
                keys[i] = "qk-" + run + "-" + i;
                Message msg = new Message(topic, body);
                msg.setKeys(keys[i]);
                SendResult r = producer.send(msg);
                if (r.getSendStatus() != SendStatus.SEND_OK) {
                    throw new IllegalStateException("seed send " + i + ": " + r);
                }
                uniq[i] = r.getMsgId();
                offsetIds[i] = r.getOffsetMsgId();
            }
        } finally {
            producer.shutdown();
        }
        Thread.sleep(settleMs);
        DefaultMQAdminExt admin = new DefaultMQAdminExt("bench_query_admin");
        admin.setInstanceName("a" + run);
        admin.setNamesrvAddr(namesrv);
        admin.start();
        Map<String, List<Double>> lat = new LinkedHashMap<>();
        Map<String, Integer> wrong = new LinkedHashMap<>();
        String[] kinds = {"key", "key_absent", "uniq", "uniq_absent", "id"};
        long end = System.currentTimeMillis() + 3600_000L;
        try {
            for (String k : kinds) {
                lat.put(k, new ArrayList<>());
                wrong.put(k, 0);
            }
            // Interleaved: query i of every kind, then query i + 1 (load on the machine falls on all kinds alike).
            for (int i = 0; i < warmup + queries; i++) {
                int m = (i * 7919) % seed;
                for (String k : kinds) {
                    long t0 = System.nanoTime();
                    boolean ok;
                    try {
                        ok = ask(admin, k, topic, keys[m], uniq[m], offsetIds[m], run, i, end);
                    } catch (Exception e) {
                        ok = false;
                        if (wrong.get(k) == 0) {
                            System.err.println(k + ": " + e);
                        }
                    }
                    long ns = System.nanoTime() - t0;
                    if (i >= warmup) {
                        lat.get(k).add(ns / 1e6);
                        if (!ok) {
                            wrong.put(k, wrong.get(k) + 1);
                        }
                    }
                }
            }
        } finally {
            admin.shutdown();
        }
        StringBuilder out = new StringBuilder("{\"seed\":").append(seed).append(",\"storedBefore\":").append(stored).append(",\"wrong\":{");
        boolean first = true;
        for (Map.Entry<String, Integer> e : wrong.entrySet()) {
            out.append(first ? "" : ",").append('"').append(e.getKey()).append("\":").append(e.getValue());
            first = false;
        }
        out.append("},\"latMs\":{");
        first = true;
        for (Map.Entry<String, List<Double>> e : lat.entrySet()) {
            out.append(first ? "" : ",").append('"').append(e.getKey()).append("\":[");
            boolean f2 = true;
            for (double v : e.getValue()) {
                out.append(f2 ? "" : ",").append(v);
                f2 = false;
            }
            out.append(']');
            first = false;
        }
        System.out.println(out.append("}}"));
        System.out.flush();
        System.exit(0);
    }

    /** Messages the topic holds before the seed sends (examineTopicStats: the queues' max offsets summed); -1 if not answered. */
    private static long storedMessages(String namesrv, String topic, String run) {
        DefaultMQAdminExt admin = new DefaultMQAdminExt("bench_query_stats");
        admin.setInstanceName("s" + run);
        admin.setNamesrvAddr(namesrv);
        try {
            admin.start();
            long n = 0;
            for (TopicOffset o : admin.examineTopicStats(topic).getOffsetTable().values()) {
                n += o.getMaxOffset() - o.getMinOffset();
            }
            return n;
        } catch (Exception e) {
            System.err.println("examineTopicStats: " + e);
            return -1;
        } finally {
            admin.shutdown();
        }
    }

    /** One query of kind k; true when the answer is the right one (the message, or none for an absent key). */
    private static boolean ask(DefaultMQAdminExt admin, String k, String topic, String key, String uniq, String offsetId,
                               String run, int i, long end) throws Exception {
        switch (k) {
            case "key": {
                QueryResult r = admin.queryMessage(topic, key, 32, 0, end);
                return r.getMessageList().size() == 1 && key.equals(r.getMessageList().get(0).getKeys());
            }
            case "key_absent":
                return absent(() -> admin.queryMessage(topic, "absent-" + run + "-" + i, 32, 0, end));
            case "uniq": {
                QueryResult r = admin.queryMessageByUniqKey(topic, uniq, 32, 0, end);
                return !r.getMessageList().isEmpty() && uniq.equals(r.getMessageList().get(0).getMsgId());
            }
            case "uniq_absent": {
                // A unique id of the same shape never sent: the last 8 hex digits of a real one changed.
                String fake = uniq.substring(0, uniq.length() - 8) + String.format("%08X", 0x7F000000 + i);
                return absent(() -> admin.queryMessageByUniqKey(topic, fake, 32, 0, end));
            }
            case "id": {
                MessageExt m = admin.viewMessage(offsetId);
                return key.equals(m.getKeys());
            }
            default:
                throw new IllegalArgumentException(k);
        }
    }

    interface Query {
        QueryResult call() throws Exception;
    }

    /** The admin API answers a key with no message with MQClientException("... no message"). */
    private static boolean absent(Query q) throws Exception {
        try {
            QueryResult r = q.call();
            return r.getMessageList().isEmpty();
        } catch (MQClientException e) {
            return e.getErrorMessage() != null && e.getErrorMessage().contains("no message");
        }
    }
}
