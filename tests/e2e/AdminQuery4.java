import com.alibaba.fastjson.JSON;
import com.alibaba.fastjson.serializer.SerializerFeature;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TimeZone;
import org.apache.rocketmq.client.QueryResult;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.common.message.MessageClientIDSetter;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

/**
 * RocketMQ 4.9.8's admin API (DefaultMQAdminExt) for the differential test, launched as a single
 * source file (java -cp <the 4.x classpath> AdminQuery4.java ...), so it needs no build step and
 * stays off the compiled drivers' classpath. One JSON line.
 *
 * <pre>
 * uniq namesrv topic msgId        viewMessage(topic, msgId): MQAdminImpl.queryMessageByUniqKey over
 *                                 [getNearlyTimeFromID(msgId) - 1000, Long.MAX_VALUE]; and
 *                                 queryMessageByUniqKey(topic, msgId, 32, 0, Long.MAX_VALUE), what
 *                                 mqadmin's queryMsgByUniqueKey asks
 * key namesrv topic key begin end queryMessage(topic, key, 64, begin, end)
 * </pre>
 * Messages are given as {"offset": commitLogOffset, "storeTimestamp": ms}; an empty answer
 * (MQClientException NO_MESSAGE) as [] or null with its "error".
 */
public final class AdminQuery4 {
    private AdminQuery4() {
    }

    public static void main(String[] args) throws Exception {
        DefaultMQAdminExt admin = new DefaultMQAdminExt();
        admin.setNamesrvAddr(args[1]);
        admin.setInstanceName("admin-query-" + System.nanoTime());
        admin.start();
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("timeZone", TimeZone.getDefault().getID());
        try {
            if (args[0].equals("uniq")) {
                out.put("begin", MessageClientIDSetter.getNearlyTimeFromID(args[3]).getTime() - 1000);
                try {
                    out.put("viewMessage", one(admin.viewMessage(args[2], args[3])));
                } catch (MQClientException e) {
                    out.put("viewMessage", null);
                    out.put("error", e.getResponseCode() + " " + e.getErrorMessage());
                }
                out.put("whole", all(admin, () -> admin.queryMessageByUniqKey(args[2], args[3], 32, 0, Long.MAX_VALUE), out, "wholeError"));
            } else {
                long begin = Long.parseLong(args[4]);
                long end = Long.parseLong(args[5]);
                out.put("queryMessage", all(admin, () -> admin.queryMessage(args[2], args[3], 64, begin, end), out, "error"));
            }
        } finally {
            admin.shutdown();
        }
        System.out.println(JSON.toJSONString(out, SerializerFeature.WriteMapNullValue));
        System.out.flush();
        System.exit(0);
    }

    interface Query {
        QueryResult run() throws Exception;
    }

    static Map<String, Object> one(MessageExt m) {
        if (m == null) {
            return null;
        }
        Map<String, Object> x = new LinkedHashMap<>();
        x.put("offset", m.getCommitLogOffset());
        x.put("storeTimestamp", m.getStoreTimestamp());
        return x;
    }

    static List<Map<String, Object>> all(DefaultMQAdminExt admin, Query q, Map<String, Object> out, String errorKey) throws Exception {
        List<Map<String, Object>> list = new ArrayList<>();
        try {
            for (MessageExt m : q.run().getMessageList()) {
                list.add(one(m));
            }
        } catch (MQClientException e) {
            out.put(errorKey, e.getResponseCode() + " " + e.getErrorMessage());
        }
        return list;
    }
}
