// Command rmq4 drives Apache RocketMQ's Go client (rocketmq-client-go/v2) against Quarry for the
// e2e tests (tests/e2e/test_go_client.py), from a JSON plan on stdin:
//
//	{"namesrv": "127.0.0.1:9876", "timeoutMs": 10000,
//	 "produce": {"group": "PG", "messages": [{"topic": "T", "tags": "A", "keys": ["k"], "props": {"p": "v"}, "body": "text"}]},
//	 "consume": {"group": "CG", "topic": "T", "expression": "*", "want": 10, "deadlineMs": 30000, "settleMs": 1000}}
//
// A DefaultProducer sends each message synchronously; then a push consumer (clustering,
// from the first offset) consumes until it has seen `want` distinct messages, and a little
// longer (settleMs) so that a duplicate shows. Prints one JSON line per event:
// {"op": "sent", "index", "msgId", "offsetMsgId", "status", "brokerName", "queueId", "queueOffset"}
// or {"op": "sent", "index", "error"}; {"op": "consumed", "msgId", "offsetMsgId", "topic", "tags",
// "keys", "props", "body", "queueId", "queueOffset", "reconsumeTimes"}; then {"done": true}.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/apache/rocketmq-client-go/v2/rlog"
)

type spec struct {
	Topic string            `json:"topic"`
	Tags  string            `json:"tags"`
	Keys  []string          `json:"keys"`
	Props map[string]string `json:"props"`
	Body  string            `json:"body"`
}

type plan struct {
	Namesrv   string `json:"namesrv"`
	TimeoutMs int    `json:"timeoutMs"`
	Produce   *struct {
		Group    string `json:"group"`
		Messages []spec `json:"messages"`
	} `json:"produce"`
	Consume *struct {
		Group      string `json:"group"`
		Topic      string `json:"topic"`
		Expression string `json:"expression"`
		Want       int    `json:"want"`
		DeadlineMs int    `json:"deadlineMs"`
		SettleMs   int    `json:"settleMs"`
	} `json:"consume"`
}

var out sync.Mutex

func emit(line map[string]interface{}) {
	b, err := json.Marshal(line)
	if err != nil {
		panic(err)
	}
	out.Lock()
	defer out.Unlock()
	fmt.Println(string(b))
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(2)
}

func main() {
	rlog.SetLogLevel("warn")
	raw, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail("stdin: %v", err)
	}
	var p plan
	if err := json.Unmarshal(raw, &p); err != nil {
		fail("plan: %v", err)
	}
	if p.TimeoutMs <= 0 {
		p.TimeoutMs = 10000
	}
	ns := primitive.NamesrvAddr{p.Namesrv}
	if p.Produce != nil {
		produce(ns, p)
	}
	if p.Consume != nil {
		consume(ns, p)
	}
	emit(map[string]interface{}{"done": true})
}

func produce(ns primitive.NamesrvAddr, p plan) {
	prod, err := rocketmq.NewProducer(producer.WithNameServer(ns), producer.WithGroupName(p.Produce.Group), producer.WithRetry(0),
		producer.WithSendMsgTimeout(time.Duration(p.TimeoutMs)*time.Millisecond), producer.WithInstanceName(fmt.Sprintf("quarry-go-%d", os.Getpid())))
	if err != nil {
		fail("producer: %v", err)
	}
	if err := prod.Start(); err != nil {
		fail("producer start: %v", err)
	}
	defer func() { _ = prod.Shutdown() }()
	for i, s := range p.Produce.Messages {
		m := primitive.NewMessage(s.Topic, []byte(s.Body))
		if s.Tags != "" {
			m.WithTag(s.Tags)
		}
		if len(s.Keys) > 0 {
			m.WithKeys(s.Keys)
		}
		for k, v := range s.Props {
			m.WithProperty(k, v)
		}
		line := map[string]interface{}{"op": "sent", "index": i, "topic": s.Topic, "keys": strings.Join(s.Keys, " ")}
		r, err := prod.SendSync(context.Background(), m)
		if err != nil {
			line["error"] = err.Error()
		} else {
			line["status"] = int(r.Status)
			line["msgId"] = r.MsgID
			line["offsetMsgId"] = r.OffsetMsgID
			line["brokerName"] = r.MessageQueue.BrokerName
			line["queueId"] = r.MessageQueue.QueueId
			line["queueOffset"] = r.QueueOffset
		}
		emit(line)
	}
}

func consume(ns primitive.NamesrvAddr, p plan) {
	c := p.Consume
	pc, err := rocketmq.NewPushConsumer(consumer.WithNameServer(ns), consumer.WithGroupName(c.Group),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset), consumer.WithConsumerModel(consumer.Clustering),
		consumer.WithInstance(fmt.Sprintf("quarry-go-%d", os.Getpid())))
	if err != nil {
		fail("push consumer: %v", err)
	}
	var mu sync.Mutex
	seen := map[string]bool{}
	expression := c.Expression
	if expression == "" {
		expression = "*"
	}
	err = pc.Subscribe(c.Topic, consumer.MessageSelector{Type: consumer.TAG, Expression: expression},
		func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
			for _, m := range msgs {
				emit(map[string]interface{}{"op": "consumed", "msgId": m.MsgId, "offsetMsgId": m.OffsetMsgId, "topic": m.Topic,
					"tags": m.GetTags(), "keys": m.GetKeys(), "props": m.GetProperties(), "body": string(m.Body),
					"brokerName": m.Queue.BrokerName, "queueId": m.Queue.QueueId, "queueOffset": m.QueueOffset, "reconsumeTimes": m.ReconsumeTimes})
				mu.Lock()
				seen[m.MsgId] = true
				mu.Unlock()
			}
			return consumer.ConsumeSuccess, nil
		})
	if err != nil {
		fail("subscribe: %v", err)
	}
	if err := pc.Start(); err != nil {
		fail("push consumer start: %v", err)
	}
	deadline := time.Now().Add(time.Duration(c.DeadlineMs) * time.Millisecond)
	for time.Now().Before(deadline) {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n >= c.Want {
			break
		}
		time.Sleep(50 * time.Millisecond) // the listener's record, polled until the deadline
	}
	settle := time.Now().Add(time.Duration(c.SettleMs) * time.Millisecond)
	for time.Now().Before(settle) { // a duplicate would show in this window
		time.Sleep(50 * time.Millisecond)
	}
	_ = pc.Shutdown()
}
