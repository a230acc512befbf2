package quarry.drivers;

import com.alibaba.fastjson.JSON;
import com.alibaba.fastjson.JSONArray;
import com.alibaba.fastjson.serializer.SerializerFeature;
import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.tools.command.MQAdminStartup;

/**
 * The real mqadmin (RocketMQ 4.9.8's MQAdminStartup.main), several commands in one JVM: stdin is
 * a JSON array of argument lists, e.g. [["clusterList", "-n", "127.0.0.1:9877"], ...]. Each
 * command runs with System.out and System.err captured, in its own thread with a deadline
 * (argv[0], ms, default 30000), and gives one JSON line {"args", "out", "err", "ms", "hung"}.
 * A hung command is reported and left behind; the JVM exits when all have run. MQAdminStartup
 * needs rocketmq.home.dir with conf/logback_tools.xml (tests/e2e/java.py makes one).
 */
public final class MqAdmin {
    private MqAdmin() {
    }

    public static void main(String[] argv) throws Exception {
        long deadlineMs = argv.length > 0 ? Long.parseLong(argv[0]) : 30000;
        JSONArray commands = JSON.parseArray(Producer4.readAll(System.in));
        for (int c = 0; c < commands.size(); c++) {
            Map<String, Object> line = run(commands.getJSONArray(c).toJavaList(String.class), deadlineMs, "mqadmin-" + c);
            System.out.println(JSON.toJSONString(line, SerializerFeature.WriteMapNullValue));
            System.out.flush();
        }
        System.exit(0);
    }

    /**
     * MQAdminStartup keeps its sub-commands in a static list that main0 only appends to, and finds
     * the first match: a second command of a kind would reuse the first's object, and some keep
     * the DefaultMQAdminExt they shut down (QueryMsgByUniqueKeySubCommand: every later query then
     * waits out its latch and finds nothing). Emptied before each command, as a fresh mqadmin
     * process starts.
     */
    static void freshSubCommands() {
        try {
            java.lang.reflect.Field f = MQAdminStartup.class.getDeclaredField("subCommandList");
            f.setAccessible(true);
            ((List<?>) f.get(null)).clear();
        } catch (ReflectiveOperationException e) {
            throw new IllegalStateException(e);
        }
    }

    /** One mqadmin command with System.out and System.err captured: {"args", "out", "err", "ms", "hung"}. */
    static synchronized Map<String, Object> run(List<String> args, long deadlineMs, String threadName) throws InterruptedException {
        PrintStream realOut = System.out;
        PrintStream realErr = System.err;
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        ByteArrayOutputStream err = new ByteArrayOutputStream();
        PrintStream o = new PrintStream(out, true, StandardCharsets.UTF_8);
        PrintStream e = new PrintStream(err, true, StandardCharsets.UTF_8);
        System.setOut(o);
        System.setErr(e);
        freshSubCommands();
        long start = System.nanoTime();
        Thread t = new Thread(() -> MQAdminStartup.main(args.toArray(new String[0])), threadName);
        t.setDaemon(true);
        t.start();
        t.join(deadlineMs);
        boolean hung = t.isAlive();
        long ms = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start);
        System.setOut(realOut);
        System.setErr(realErr);
        o.flush();
        e.flush();
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("args", args);
        line.put("out", out.toString(StandardCharsets.UTF_8));
        line.put("err", err.toString(StandardCharsets.UTF_8));
        line.put("ms", ms);
        line.put("hung", hung);
        return line;
    }
}
