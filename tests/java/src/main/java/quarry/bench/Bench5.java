package quarry.bench;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.producer.Producer;

/**
 * Bench4's load from rocketmq-client-java 5.x (the gRPC client; endpoint: the router): N threads
 * of sync Producer.send, 1 KiB bodies of "hello baby", a key (the send's second) each.
 *
 * <pre>java quarry.bench.Bench5 endpoints topic threads messages warmupMs bodyBytes</pre>
 *
 * Prints one JSON line: {"threads", "messages", "failed", "seconds", "rate", "latMs": [..]}.
 */
public final class Bench5 {
    private Bench5() {
    }

    public static void main(String[] args) throws Exception {
        String endpoints = args[0];
        String topic = args[1];
        int threads = Integer.parseInt(args[2]);
        int messages = Integer.parseInt(args[3]);
        long warmupMs = Long.parseLong(args[4]);
        byte[] body = body(Integer.parseInt(args[5]));
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        ClientConfiguration config = ClientConfiguration.newBuilder().setEndpoints(endpoints).enableSsl(false)
            .setRequestTimeout(Duration.ofSeconds(10)).build();
        AtomicLong failed = new AtomicLong();
        try (Producer producer = provider.newProducerBuilder().setClientConfiguration(config).setTopics(topic).build()) {
            long warmEnd = System.currentTimeMillis() + warmupMs;  // routes, connections, the JIT
            do {
                run(provider, producer, topic, body, threads, 100 * threads, failed, null);
            } while (System.currentTimeMillis() < warmEnd);
            failed.set(0);
            long[][] lat = new long[threads][];
            long start = System.nanoTime();
            run(provider, producer, topic, body, threads, messages, failed, lat);
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
        }
        System.exit(0);
    }

    /** Bench4's body (not called from here: Bench4 needs the 4.x jars, absent from this classpath). */
    static byte[] body(int size) {
        StringBuilder sb = new StringBuilder();
        while (sb.length() < size) {
            sb.append("hello baby");
        }
        return sb.substring(0, size).getBytes(java.nio.charset.StandardCharsets.UTF_8);
    }

    private static void run(ClientServiceProvider provider, Producer producer, String topic, byte[] body, int threads, int total,
                            AtomicLong failed, long[][] lat) throws InterruptedException {
        List<Thread> workers = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            int share = total / threads + (t < total % threads ? 1 : 0);
            long[] mine = new long[share];
            if (lat != null) {
                lat[t] = mine;
            }
            Thread w = new Thread(() -> {
                for (int i = 0; i < share; i++) {
                    Message msg = provider.newMessageBuilder().setTopic(topic).setBody(body)
                        .setKeys(String.valueOf(System.currentTimeMillis() / 1000)).build();
                    long t0 = System.nanoTime();
                    try {
                        producer.send(msg);
                        mine[i] = System.nanoTime() - t0;
                    } catch (Exception e) {
                        mine[i] = -1;
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
