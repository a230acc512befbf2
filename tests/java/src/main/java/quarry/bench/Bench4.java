package quarry.bench;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.message.Message;

/**
 * What RocketMQ's benchmark Producer (rocketmq-example's org.apache.rocketmq.example.benchmark.Producer)
 * does, with each send's latency kept: N threads of sync sends of 1 KiB bodies of "hello baby",
 * the key the benchmark sets (the send's second, with -k true), no compression. That Producer
 * prints only the rate and the mean and max latency every 10 s and runs until killed; bench
 * java_clients runs it too, for its own figure, and this for p50 and p99 (bench/java_clients.py).
 *
 * <pre>java quarry.bench.Bench4 namesrv topic threads messages warmupMs bodyBytes</pre>
 *
 * Prints one JSON line: {"threads", "messages", "failed", "seconds", "rate", "latMs": [..]}.
 */
public final class Bench4 {
    private Bench4() {
    }

    public static void main(String[] args) throws Exception {
        String namesrv = args[0];
        String topic = args[1];
        int threads = Integer.parseInt(args[2]);
        int messages = Integer.parseInt(args[3]);
        long warmupMs = Long.parseLong(args[4]);
        byte[] body = body(Integer.parseInt(args[5]));
        DefaultMQProducer producer = new DefaultMQProducer("benchmark_producer");
        producer.setInstanceName(Long.toString(System.currentTimeMillis()));
        producer.setNamesrvAddr(namesrv);
        producer.setCompressMsgBodyOverHowmuch(Integer.MAX_VALUE);
        producer.start();
        AtomicLong failed = new AtomicLong();
        try {
            long warmEnd = System.currentTimeMillis() + warmupMs;  // routes, connections, the JIT
            do {
                run(producer, topic, body, threads, 100 * threads, failed, null);
            } while (System.currentTimeMillis() < warmEnd);
            failed.set(0);
            long[][] lat = new long[threads][];
            long start = System.nanoTime();
            run(producer, topic, body, threads, messages, failed, lat);
            double seconds = (System.nanoTime() - start) / 1e9;
            StringBuilder out = new StringBuilder();
            out.append("{\"threads\":").append(threads).append(",\"messages\":").append(messages)
                .append(",\"failed\":").append(failed.get()).append(",\"seconds\":").append(seconds)
                .append(",\"rate\":").append((messages - failed.get()) / seconds).append(",\"latMs\":[");
            boolean first = true;
            for (long[] perThread : lat) {
                for (long ns : perThread) {
                    if (ns >= 0) {
                        out.append(first ? "" : ",").append(ns / 1e6);
                        first = false;
                    }
                }
            }
            System.out.println(out.append("]}"));
            System.out.flush();
        } finally {
            producer.shutdown();
        }
        System.exit(0);
    }

    static byte[] body(int size) {
        StringBuilder sb = new StringBuilder();
        while (sb.length() < size) {
            sb.append("hello baby");
        }
        return sb.substring(0, size).getBytes(StandardCharsets.UTF_8);
    }

    /** `threads` threads send `total` messages between them; each send's nanoseconds into lat[thread] (-1: failed). */
    private static void run(DefaultMQProducer producer, String topic, byte[] body, int threads, int total, AtomicLong failed,
                            long[][] lat) throws InterruptedException {
        List<Thread> workers = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            int share = total / threads + (t < total % threads ? 1 : 0);
            long[] mine = new long[share];
            if (lat != null) {
                lat[t] = mine;
            }
            Thread w = new Thread(() -> {
                for (int i = 0; i < share; i++) {
                    long begin = System.currentTimeMillis();
                    Message msg = new Message(topic, body);
                    msg.setKeys(String.valueOf(begin / 1000));
                    long t0 = System.nanoTime();
                    try {
                        SendResult r = producer.send(msg);
                        mine[i] = r.getSendStatus() == SendStatus.SEND_OK ? System.nanoTime() - t0 : -1;
                    } catch (Exception e) {
                        mine[i] = -1;
                    }
                    if (mine[i] < 0) {
                        failed.incrementAndGet();
                    }
                }
            }, "bench-" + t);
            workers.add(w);
            w.start();
        }
        for (Thread w : workers) {
            w.join();
        }
    }
}
