package quarry.drivers;

import com.alibaba.fastjson.JSON;
import com.alibaba.fastjson.JSONArray;
import com.alibaba.fastjson.JSONObject;
import com.alibaba.fastjson.serializer.SerializerFeature;
import java.io.ByteArrayOutputStream;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.SplittableRandom;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageClientIDSetter;
import org.apache.rocketmq.common.protocol.ResponseCode;
import org.apache.rocketmq.remoting.RPCHook;

/**
 * RocketMQ 4.9.8's DefaultMQProducer, driven by a JSON plan on stdin; one JVM for every send.
 *
 * <pre>
 * {"namesrv": "127.0.0.1:9877", "group": "PG", "timeoutMs": 15000,
 *  "accessKey": "ak", "secretKey": "sk",    (optional: every request signed by AclClientRPCHook)
 *  "sends": [{"mode": "sync|async|oneway|batch", "messages": [
 *     {"topic": "T", "tags": "TagA", "keys": ["k1", "k2"], "props": {"p": "v"}, "delayLevel": 1,
 *      "body": "text" | "randomBytes": 4194304, "seed": 7}], "pauseMs": 0}]}
 * </pre>
 *
 * "pauseMs" (sync sends): a pause after each send, to pace a load. Each result carries
 * "ackMs", the wall-clock time (epoch ms) the acknowledgement arrived.
 *
 * Prints one JSON line per message sent ({"send", "index", "mode", "status", "msgId",
 * "offsetMsgId", "brokerName", "queueId", "queueOffset", "keys", "tags", "bodyLength",
 * "bodySha256"}, or {"send", "index", "mode", "error", "code", "codeName"}: the response code
 * the client's exception carries, and its name in RocketMQ's ResponseCode), then {"done": true}. A oneway send has
 * no result: its msgId is the UNIQ_KEY the client set, its offsetMsgId null.
 */
public final class Producer4 {
    /** The JVM's stdout, where the JSON lines go (even while an in-process mqadmin's System.out is captured). */
    static final java.io.PrintStream STDOUT = System.out;

    private Producer4() {
    }

    public static void main(String[] args) throws Exception {
        JSONObject plan = JSON.parseObject(readAll(System.in));
        DefaultMQProducer producer = new DefaultMQProducer(plan.getString("group"), aclHook(plan));
        producer.setNamesrvAddr(plan.getString("namesrv"));
        producer.setInstanceName("quarry-driver-" + ProcessHandle.current().pid());
        int timeoutMs = plan.getIntValue("timeoutMs") > 0 ? plan.getIntValue("timeoutMs") : 15000;
        producer.setSendMsgTimeout(timeoutMs);
        producer.setRetryTimesWhenSendFailed(0);
        producer.setRetryTimesWhenSendAsyncFailed(0);
        producer.start();
        try {
            JSONArray sends = plan.getJSONArray("sends");
            for (int s = 0; s < sends.size(); s++) {
                JSONObject send = sends.getJSONObject(s);
                String mode = send.getString("mode");
                List<Message> msgs = new ArrayList<>();
                JSONArray specs = send.getJSONArray("messages");
                for (int i = 0; i < specs.size(); i++) {
                    msgs.add(message(specs.getJSONObject(i)));
                }
                try {
                    run(producer, s, mode, msgs, timeoutMs, send.getLongValue("pauseMs"));
                } catch (Exception e) {
                    for (int i = 0; i < msgs.size(); i++) {
                        error(s, i, mode, e);
                    }
                }
            }
        } finally {
            producer.shutdown();
        }
        emit(Map.of("done", true));
        System.out.flush();
        System.exit(0);
    }

    private static void run(DefaultMQProducer producer, int s, String mode, List<Message> msgs, long timeoutMs, long pauseMs) throws Exception {
        switch (mode) {
            case "sync":
                for (int i = 0; i < msgs.size(); i++) {
                    try {
                        result(s, i, mode, msgs.get(i), producer.send(msgs.get(i)));
                    } catch (Exception e) {
                        error(s, i, mode, e);
                    }
                    if (pauseMs > 0) {
                        Thread.sleep(pauseMs);
                    }
                }
                break;
            case "async": {
                CountDownLatch done = new CountDownLatch(msgs.size());
                for (int i = 0; i < msgs.size(); i++) {
                    final int index = i;
                    final Message msg = msgs.get(i);
                    producer.send(msg, new SendCallback() {
                        @Override
                        public void onSuccess(SendResult r) {
                            result(s, index, mode, msg, r);
                            done.countDown();
                        }

                        @Override
                        public void onException(Throwable e) {
                            error(s, index, mode, e);
                            done.countDown();
                        }
                    });
                }
                if (!done.await(timeoutMs + 5000, TimeUnit.MILLISECONDS)) {
                    emit(Map.of("send", s, "mode", mode, "error", "async callbacks missing after " + (timeoutMs + 5000) + " ms"));
                }
                break;
            }
            case "oneway":
                for (int i = 0; i < msgs.size(); i++) {
                    producer.sendOneway(msgs.get(i));
                    result(s, i, mode, msgs.get(i), null);
                }
                break;
            case "batch": {
                SendResult r = producer.send(msgs);
                long ackMs = System.currentTimeMillis();
                String[] ids = r.getMsgId() == null ? new String[0] : r.getMsgId().split(",");
                String[] offsetIds = r.getOffsetMsgId() == null ? new String[0] : r.getOffsetMsgId().split(",");
                for (int i = 0; i < msgs.size(); i++) {
                    Map<String, Object> line = describe(s, i, mode, msgs.get(i));
                    line.put("status", r.getSendStatus().name());
                    line.put("msgId", i < ids.length ? ids[i] : null);
                    line.put("offsetMsgId", i < offsetIds.length ? offsetIds[i] : null);
                    line.put("resultMsgIds", ids.length);
                    line.put("resultOffsetMsgIds", offsetIds.length);
                    line.put("brokerName", r.getMessageQueue().getBrokerName());
                    line.put("queueId", r.getMessageQueue().getQueueId());
                    line.put("queueOffset", r.getQueueOffset() + i);
                    line.put("ackMs", ackMs);
                    emit(line);
                }
                break;
            }
            default:
                throw new IllegalArgumentException("unknown mode " + mode);
        }
    }

    private static Message message(JSONObject spec) throws Exception {
        byte[] body;
        if (spec.containsKey("randomBytes")) {
            body = new byte[spec.getIntValue("randomBytes")];
            SplittableRandom rnd = new SplittableRandom(spec.getLongValue("seed"));
            for (int i = 0; i < body.length; i += 8) {
                long v = rnd.nextLong();
                for (int j = 0; j < 8 && i + j < body.length; j++) {
                    body[i + j] = (byte) (v >>> (8 * j));
                }
            }
        } else {
            body = spec.getString("body").getBytes(StandardCharsets.UTF_8);
        }
        Message msg = new Message(spec.getString("topic"), spec.getString("tags"), body);
        JSONArray keys = spec.getJSONArray("keys");
        if (keys != null) {
            msg.setKeys(keys.toJavaList(String.class));
        }
        JSONObject props = spec.getJSONObject("props");
        if (props != null) {
            for (String k : props.keySet()) {
                msg.putUserProperty(k, props.getString(k));
            }
        }
        if (spec.getIntValue("delayLevel") > 0) {
            msg.setDelayTimeLevel(spec.getIntValue("delayLevel"));
        }
        return msg;
    }

    /** AclClientRPCHook with the plan's accessKey and secretKey, or null (no signing). */
    static RPCHook aclHook(JSONObject plan) {
        String ak = plan.getString("accessKey");
        return ak == null ? null : new AclClientRPCHook(new SessionCredentials(ak, plan.getString("secretKey")));
    }

    /** The response code an exception (or one of its causes) carries: -1 when none. */
    static int responseCode(Throwable e) {
        for (Throwable t = e; t != null; t = t.getCause()) {
            if (t instanceof MQBrokerException) {
                return ((MQBrokerException) t).getResponseCode();
            }
            if (t instanceof MQClientException && ((MQClientException) t).getResponseCode() > 0) {
                return ((MQClientException) t).getResponseCode();
            }
        }
        return -1;
    }

    /** A response code's name in RocketMQ's ResponseCode (or its RemotingSysResponseCode base). */
    static String codeName(int code) {
        for (java.lang.reflect.Field f : ResponseCode.class.getFields()) {
            try {
                if (f.getType() == int.class && f.getInt(null) == code) {
                    return f.getName();
                }
            } catch (IllegalAccessException ignored) {
                // a public static field: readable
            }
        }
        return null;
    }

    static void putCode(Map<String, Object> line, Throwable e) {
        int code = responseCode(e);
        line.put("code", code);
        line.put("codeName", code > 0 ? codeName(code) : null);
        String chain = "";
        for (Throwable t = e.getCause(); t != null; t = t.getCause()) {
            chain += (chain.isEmpty() ? "" : " <- ") + t.getClass().getName() + ": " + t.getMessage();
        }
        line.put("causes", chain);
    }

    private static Map<String, Object> describe(int s, int i, String mode, Message msg) {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("send", s);
        line.put("index", i);
        line.put("mode", mode);
        line.put("topic", msg.getTopic());
        line.put("tags", msg.getTags());
        line.put("keys", msg.getKeys());
        line.put("uniqKey", MessageClientIDSetter.getUniqID(msg));
        line.put("bodyLength", msg.getBody().length);
        line.put("bodySha256", sha256(msg.getBody()));
        return line;
    }

    private static synchronized void result(int s, int i, String mode, Message msg, SendResult r) {
        long ackMs = System.currentTimeMillis();
        Map<String, Object> line = describe(s, i, mode, msg);
        if (r == null) {
            line.put("status", null);
            line.put("msgId", MessageClientIDSetter.getUniqID(msg));
            line.put("offsetMsgId", null);
        } else {
            line.put("status", r.getSendStatus().name());
            line.put("msgId", r.getMsgId());
            line.put("offsetMsgId", r.getOffsetMsgId());
            line.put("brokerName", r.getMessageQueue().getBrokerName());
            line.put("queueId", r.getMessageQueue().getQueueId());
            line.put("queueOffset", r.getQueueOffset());
        }
        line.put("ackMs", ackMs);
        emit(line);
    }

    private static synchronized void error(int s, int i, String mode, Throwable e) {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("send", s);
        line.put("index", i);
        line.put("mode", mode);
        line.put("error", e.getClass().getName() + ": " + e.getMessage());
        putCode(line, e);
        emit(line);
    }

    static synchronized void emit(Map<String, ?> line) {
        STDOUT.println(JSON.toJSONString(line, SerializerFeature.WriteMapNullValue));
        STDOUT.flush();
    }

    static String sha256(byte[] data) {
        try {
            StringBuilder sb = new StringBuilder();
            for (byte b : MessageDigest.getInstance("SHA-256").digest(data)) {
                sb.append(String.format("%02x", b));
            }
            return sb.toString();
        } catch (Exception e) {
            throw new IllegalStateException(e);
        }
    }

    static String readAll(InputStream in) throws Exception {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        in.transferTo(out);
        return out.toString(StandardCharsets.UTF_8);
    }
}
