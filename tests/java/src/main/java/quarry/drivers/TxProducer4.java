package quarry.drivers;

import com.alibaba.fastjson.JSON;
import com.alibaba.fastjson.JSONArray;
import com.alibaba.fastjson.JSONObject;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * RocketMQ 4.9.8's TransactionMQProducer, driven by a JSON plan on stdin; one JVM.
 *
 * <pre>
 * {"namesrv": "127.0.0.1:9877", "group": "PG_tx", "topic": "T", "timeoutMs": 15000, "checkDeadlineMs": 60000,
 *  "messages": [{"name": "commit-0", "local": "COMMIT_MESSAGE|ROLLBACK_MESSAGE|UNKNOW",
 *                "checks": ["UNKNOW", "COMMIT_MESSAGE"]}]}
 * </pre>
 *
 * Each message (key: its name, user property "name") is sent with sendMessageInTransaction;
 * the listener's executeLocalTransaction answers "local", and the broker's checks
 * (checkLocalTransaction) are answered from "checks" in turn (UNKNOW once they run out).
 * Prints {"send", "name", "status", "localState", "msgId", "offsetMsgId", "brokerName",
 * "queueId"} per send, {"check", "name", "n", "answer", "transactionId", "msgId", "topic",
 * "queueId", "commitLogOffset", "queueOffset", "body", "keys", "storeHost"} per check received,
 * then waits (up to checkDeadlineMs) until every message got as many checks as it has answers
 * and each answer was sent (END_TRANSACTION), and prints {"done": true, "missing": [...]}.
 */
public final class TxProducer4 {
    private TxProducer4() {
    }

    public static void main(String[] args) throws Exception {
        JSONObject plan = JSON.parseObject(Producer4.readAll(System.in));
        Map<String, List<String>> answers = new ConcurrentHashMap<>();
        Map<String, String> local = new ConcurrentHashMap<>();
        Map<String, AtomicInteger> checks = new ConcurrentHashMap<>();
        JSONArray specs = plan.getJSONArray("messages");
        for (int i = 0; i < specs.size(); i++) {
            JSONObject m = specs.getJSONObject(i);
            String name = m.getString("name");
            local.put(name, m.getString("local"));
            JSONArray c = m.getJSONArray("checks");
            answers.put(name, c == null ? new ArrayList<>() : c.toJavaList(String.class));
            checks.put(name, new AtomicInteger());
        }
        TransactionMQProducer producer = new TransactionMQProducer(plan.getString("group"));
        producer.setNamesrvAddr(plan.getString("namesrv"));
        producer.setInstanceName("quarry-tx-driver-" + ProcessHandle.current().pid());
        int timeoutMs = plan.getIntValue("timeoutMs") > 0 ? plan.getIntValue("timeoutMs") : 15000;
        producer.setSendMsgTimeout(timeoutMs);
        // The checks run here: the driver waits until none is left running (each ends with END_TRANSACTION sent).
        ThreadPoolExecutor checkPool = new ThreadPoolExecutor(1, 1, 60, TimeUnit.SECONDS, new ArrayBlockingQueue<>(1000));
        producer.setExecutorService(checkPool);
        producer.setTransactionListener(new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                return LocalTransactionState.valueOf(local.get(msg.getUserProperty("name")));
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                String name = msg.getUserProperty("name");
                AtomicInteger count = checks.get(name);
                List<String> planned = answers.get(name);
                if (count == null || planned == null) {
                    Producer4.emit(Map.of("check", "unplanned", "name", String.valueOf(name), "msgId", String.valueOf(msg.getMsgId())));
                    return LocalTransactionState.UNKNOW;
                }
                int n = count.get();
                String answer = n < planned.size() ? planned.get(n) : "UNKNOW";
                Map<String, Object> line = new LinkedHashMap<>();
                line.put("check", n + 1);
                line.put("name", name);
                line.put("answer", answer);
                line.put("transactionId", msg.getTransactionId());
                line.put("msgId", msg.getMsgId());
                line.put("topic", msg.getTopic());
                line.put("queueId", msg.getQueueId());
                line.put("commitLogOffset", msg.getCommitLogOffset());
                line.put("queueOffset", msg.getQueueOffset());
                line.put("body", new String(msg.getBody(), StandardCharsets.UTF_8));
                line.put("keys", msg.getKeys());
                line.put("storeHost", String.valueOf(msg.getStoreHost()));
                Producer4.emit(line);
                count.incrementAndGet();  // after the line: the main thread waits for the count
                return LocalTransactionState.valueOf(answer);
            }
        });
        producer.start();
        try {
            for (int i = 0; i < specs.size(); i++) {
                JSONObject m = specs.getJSONObject(i);
                String name = m.getString("name");
                Message msg = new Message(plan.getString("topic"), "TagTx", ("tx body of " + name).getBytes(StandardCharsets.UTF_8));
                msg.setKeys(List.of(name, "tx-shared"));
                msg.putUserProperty("name", name);
                Map<String, Object> line = new LinkedHashMap<>();
                line.put("send", i);
                line.put("name", name);
                try {
                    TransactionSendResult r = producer.sendMessageInTransaction(msg, null);
                    line.put("status", r.getSendStatus().name());
                    line.put("localState", r.getLocalTransactionState().name());
                    line.put("msgId", r.getMsgId());
                    line.put("offsetMsgId", r.getOffsetMsgId());
                    line.put("brokerName", r.getMessageQueue().getBrokerName());
                    line.put("queueId", r.getMessageQueue().getQueueId());
                } catch (Exception e) {
                    line.put("error", e.getClass().getName() + ": " + e.getMessage());
                }
                Producer4.emit(line);
            }
            long deadline = System.currentTimeMillis() + (plan.getLongValue("checkDeadlineMs") > 0 ? plan.getLongValue("checkDeadlineMs") : 60000);
            List<String> missing = missing(answers, checks);
            while (System.currentTimeMillis() < deadline && !(missing.isEmpty() && checkPool.getActiveCount() == 0 && checkPool.getQueue().isEmpty())) {
                Thread.sleep(20);  // polling a condition with a deadline (the checks come from the broker)
                missing = missing(answers, checks);
            }
            Producer4.emit(Map.of("done", true, "missing", missing));
        } finally {
            producer.shutdown();
            checkPool.shutdown();
        }
        System.out.flush();
        System.exit(0);
    }

    private static List<String> missing(Map<String, List<String>> answers, Map<String, AtomicInteger> checks) {
        List<String> out = new ArrayList<>();
        for (Map.Entry<String, List<String>> e : answers.entrySet()) {
            if (checks.get(e.getKey()).get() < e.getValue().size()) {
                out.add(e.getKey());
            }
        }
        return out;
    }
}
