package interop

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"reflect"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestServerPropertiesAdvertiseRabbitMQCapabilities(t *testing.T) {
	c := dial(t)
	caps, ok := c.Properties["capabilities"].(amqp.Table)
	if !ok {
		t.Fatalf("no capabilities table: %v", c.Properties)
	}
	for _, name := range []string{"publisher_confirms", "exchange_exchange_bindings", "basic.nack",
		"consumer_cancel_notify", "connection.blocked", "authentication_failure_close",
		"per_consumer_qos", "consumer_priorities", "direct_reply_to"} {
		if caps[name] != true {
			t.Errorf("capability %s = %v", name, caps[name])
		}
	}
	if c.Major != 0 || c.Minor != 9 {
		t.Errorf("version %d.%d", c.Major, c.Minor)
	}
}

func TestTuneNegotiatesTheSmallerLimits(t *testing.T) {
	c, err := amqp.DialConfig(brokerURI, amqp.Config{ChannelMax: 10, FrameSize: 8192, Heartbeat: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Config.ChannelMax != 10 || c.Config.FrameSize != 8192 || c.Config.Heartbeat != 5*time.Second {
		t.Fatalf("negotiated %+v", c.Config)
	}
	c2 := dial(t)
	if c2.Config.ChannelMax != 2047 || c2.Config.FrameSize != 131072 {
		t.Fatalf("defaults: channel_max %d frame_max %d", c2.Config.ChannelMax, c2.Config.FrameSize)
	}
}

func TestBadPasswordIsRefusedWith403(t *testing.T) {
	u, _ := amqp.ParseURI(brokerURI)
	u.Password = "wrong"
	_, err := amqp.Dial(u.String())
	// amqp091-go does not advertise authentication_failure_close, so the broker just drops the
	// socket (after 3 s on RabbitMQ) and the client reports its own ErrCredentials (403).
	if !errors.Is(err, amqp.ErrCredentials) {
		t.Fatalf("expected ErrCredentials, got %v", err)
	}
}

func TestAMQPLAINLoginOpensConnection(t *testing.T) {
	u, _ := amqp.ParseURI(brokerURI)
	c, err := amqp.DialConfig(brokerURI, amqp.Config{
		SASL: []amqp.Authentication{&amqp.AMQPlainAuth{Username: u.Username, Password: u.Password}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	channel(t, c)
}

func TestMissingVhostIsRefusedWith530(t *testing.T) {
	u, _ := amqp.ParseURI(brokerURI)
	u.Vhost = "no-such-vhost-go"
	_, err := amqp.Dial(u.String())
	expectAMQPError(t, err, 530, "NOT_ALLOWED - vhost no-such-vhost-go not found")
}

func TestExchangeDeclarePassiveMissingIs404(t *testing.T) {
	ch := channel(t, dial(t))
	name := uniqueName(t)
	err := ch.ExchangeDeclarePassive(name, "direct", false, false, false, false, nil)
	expectAMQPError(t, err, 404, "NOT_FOUND - no exchange '"+name+"' in vhost '/'")
}

func TestExchangeRedeclareWithOtherTypeIs406(t *testing.T) {
	c := dial(t)
	ch := channel(t, c)
	name := uniqueName(t)
	if err := ch.ExchangeDeclare(name, "direct", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	err := ch.ExchangeDeclare(name, "topic", false, true, false, false, nil)
	expectAMQPError(t, err, 406, "PRECONDITION_FAILED - inequivalent arg 'type' for exchange '"+name+"'")
	_ = channel(t, c).ExchangeDelete(name, false, false)
}

func TestQueueLifecycleCountsAndErrors(t *testing.T) {
	c := dial(t)
	ch := channel(t, c)
	name := uniqueName(t)
	q, err := ch.QueueDeclare(name, false, false, false, false, nil)
	if err != nil || q.Name != name || q.Messages != 0 || q.Consumers != 0 {
		t.Fatalf("declare: %+v %v", q, err)
	}
	for i := 0; i < 3; i++ {
		publish(t, ch, "", name, amqp.Publishing{Body: []byte{byte(i)}})
	}
	deadline := time.Now().Add(waitTimeout)
	for {
		q, err = ch.QueueDeclarePassive(name, false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if q.Messages == 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if q.Messages != 3 {
		t.Fatalf("message count %d", q.Messages)
	}
	_, err = ch.QueueDelete(name, false, true, false)
	expectAMQPError(t, err, 406, "PRECONDITION_FAILED - queue '"+name+"' in vhost '/' not empty")
	ch = channel(t, c)
	n, err := ch.QueuePurge(name, false)
	if err != nil || n != 3 {
		t.Fatalf("purge: %d %v", n, err)
	}
	if _, err := ch.QueueDelete(name, false, true, false); err != nil {
		t.Fatal(err)
	}
	_, err = ch.QueueDeclarePassive(name, false, false, false, false, nil)
	expectAMQPError(t, err, 404, "NOT_FOUND - no queue '"+name+"' in vhost '/'")
}

func TestExclusiveQueueIsLockedForOtherConnections(t *testing.T) {
	name := uniqueName(t)
	if _, err := channel(t, dial(t)).QueueDeclare(name, false, false, true, false, nil); err != nil {
		t.Fatal(err)
	}
	_, err := channel(t, dial(t)).QueueDeclarePassive(name, false, false, false, false, nil)
	expectAMQPError(t, err, 405, "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '"+name+"'")
}

func TestTopicRoutingThroughExchangeToExchangeBinding(t *testing.T) {
	ch := channel(t, dial(t))
	src, dst := uniqueName(t)+".src", uniqueName(t)+".dst"
	for _, ex := range []string{src, dst} {
		if err := ch.ExchangeDeclare(ex, "topic", false, true, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := ch.ExchangeBind(dst, "#.b", src, false, nil); err != nil {
		t.Fatal(err)
	}
	q := tempQueue(t, ch)
	if err := ch.QueueBind(q, "a.*", dst, false, nil); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"a.b", "a.c", "x.b", "a.b.b"} {
		publish(t, ch, src, key, amqp.Publishing{Body: []byte(key)})
	}
	publish(t, ch, "", q, amqp.Publishing{Body: []byte("marker")})
	if got := string(getOne(t, ch, q, true).Body); got != "a.b" {
		t.Fatalf("first routed %q", got)
	}
	if got := string(getOne(t, ch, q, true).Body); got != "marker" {
		t.Fatalf("expected marker, got %q", got)
	}
	_ = ch.ExchangeDelete(src, false, false)
	_ = ch.ExchangeDelete(dst, false, false)
}

func TestHeadersExchangeAnyAndAll(t *testing.T) {
	ch := channel(t, dial(t))
	ex := uniqueName(t)
	if err := ch.ExchangeDeclare(ex, "headers", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	all, anyQ := tempQueue(t, ch), tempQueue(t, ch)
	_ = ch.QueueBind(all, "", ex, false, amqp.Table{"x-match": "all", "a": int32(1), "b": "x"})
	_ = ch.QueueBind(anyQ, "", ex, false, amqp.Table{"x-match": "any", "a": int32(1), "b": "x"})
	publish(t, ch, ex, "", amqp.Publishing{Headers: amqp.Table{"a": int32(1)}, Body: []byte("a-only")})
	publish(t, ch, ex, "", amqp.Publishing{Headers: amqp.Table{"a": int32(1), "b": "x"}, Body: []byte("both")})
	publish(t, ch, "", all, amqp.Publishing{Body: []byte("marker")})
	publish(t, ch, "", anyQ, amqp.Publishing{Body: []byte("marker")})
	for q, want := range map[string][]string{all: {"both", "marker"}, anyQ: {"a-only", "both", "marker"}} {
		for _, w := range want {
			if got := string(getOne(t, ch, q, true).Body); got != w {
				t.Fatalf("queue %s: got %q want %q", q, got, w)
			}
		}
	}
	_ = ch.ExchangeDelete(ex, false, false)
}

func TestConsumeAckNackRejectAndRedelivered(t *testing.T) {
	ch := channel(t, dial(t))
	q := tempQueue(t, ch)
	for _, b := range []string{"ack", "nack", "reject"} {
		publish(t, ch, "", q, amqp.Publishing{Body: []byte(b)})
	}
	deliveries, err := ch.Consume(q, "go-consumer", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	d1, d2, d3 := receive(t, deliveries), receive(t, deliveries), receive(t, deliveries)
	if d1.ConsumerTag != "go-consumer" || d1.DeliveryTag != 1 || d3.DeliveryTag != 3 {
		t.Fatalf("tags %q %d %d", d1.ConsumerTag, d1.DeliveryTag, d3.DeliveryTag)
	}
	_ = d1.Ack(false)
	_ = d2.Nack(false, true)
	_ = d3.Reject(true)
	r1, r2 := receive(t, deliveries), receive(t, deliveries)
	if !r1.Redelivered || !r2.Redelivered || string(r1.Body) != "nack" || string(r2.Body) != "reject" {
		t.Fatalf("redelivered %v %q %v %q", r1.Redelivered, r1.Body, r2.Redelivered, r2.Body)
	}
	_ = r2.Ack(true)
}

func TestAckOfUnknownDeliveryTagIs406(t *testing.T) {
	ch := channel(t, dial(t))
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := ch.Ack(99, false); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-closed:
		expectAMQPError(t, e, 406, "PRECONDITION_FAILED - unknown delivery tag 99")
	case <-time.After(waitTimeout):
		t.Fatal("channel not closed")
	}
}

// A multiple ack must name a delivery still unacked (RabbitMQ's collect_acks): on a
// transactional channel as on a plain one, a tag past the last delivery closes the channel at
// once, not at tx.commit.
func TestTxAckMultiplePastTheLastDeliveryIs406AtOnce(t *testing.T) {
	ch := channel(t, dial(t))
	q := tempQueue(t, ch)
	for _, b := range []string{"one", "two"} {
		publish(t, ch, "", q, amqp.Publishing{Body: []byte(b)})
	}
	if err := ch.Tx(); err != nil {
		t.Fatal(err)
	}
	getOne(t, ch, q, false)
	last := getOne(t, ch, q, false).DeliveryTag
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	past := last + 5
	if err := ch.Ack(past, true); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-closed:
		expectAMQPError(t, e, 406, fmt.Sprintf("PRECONDITION_FAILED - unknown delivery tag %d", past))
	case <-time.After(waitTimeout):
		t.Fatal("channel not closed")
	}
}

func TestPrefetchLimitsUnackedDeliveries(t *testing.T) {
	ch := channel(t, dial(t))
	q := tempQueue(t, ch)
	for i := 0; i < 5; i++ {
		publish(t, ch, "", q, amqp.Publishing{Body: []byte{byte(i)}})
	}
	if err := ch.Qos(2, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, _ := ch.Consume(q, "", false, false, false, false, nil)
	receive(t, deliveries)
	d := receive(t, deliveries)
	select {
	case extra := <-deliveries:
		t.Fatalf("third delivery beyond prefetch: %v", extra.Body)
	case <-time.After(300 * time.Millisecond):
	}
	_ = d.Ack(true)
	receive(t, deliveries)
}

func TestMandatoryUnroutableIsReturnedWith312(t *testing.T) {
	ch := channel(t, dial(t))
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	if err := ch.Publish("amq.direct", uniqueName(t), true, false, amqp.Publishing{Body: []byte("back")}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-returns:
		if r.ReplyCode != 312 || r.ReplyText != "NO_ROUTE" || string(r.Body) != "back" {
			t.Fatalf("return %d %q %q", r.ReplyCode, r.ReplyText, r.Body)
		}
	case <-time.After(waitTimeout):
		t.Fatal("no basic.return")
	}
}

func TestPublisherConfirmsAckEverySequenceNumber(t *testing.T) {
	ch := channel(t, dial(t))
	q := tempQueue(t, ch)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 100))
	for i := 0; i < 100; i++ {
		publish(t, ch, "", q, amqp.Publishing{Body: []byte("c")})
	}
	for want := uint64(1); want <= 100; want++ {
		select {
		case c := <-confirms:
			if c.DeliveryTag != want || !c.Ack {
				t.Fatalf("confirm %d: %+v", want, c)
			}
		case <-time.After(waitTimeout):
			t.Fatalf("confirm %d missing", want)
		}
	}
}

func TestConfirmNackOnRejectPublishOverflow(t *testing.T) {
	ch := channel(t, dial(t))
	q, err := ch.QueueDeclare("", false, false, true, false, amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"})
	if err != nil {
		t.Fatal(err)
	}
	_ = ch.Confirm(false)
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 2))
	publish(t, ch, "", q.Name, amqp.Publishing{Body: []byte("fits")})
	publish(t, ch, "", q.Name, amqp.Publishing{Body: []byte("overflows")})
	for _, wantAck := range []bool{true, false} {
		select {
		case c := <-confirms:
			if c.Ack != wantAck {
				t.Fatalf("confirm %d ack=%v want %v", c.DeliveryTag, c.Ack, wantAck)
			}
		case <-time.After(waitTimeout):
			t.Fatal("confirm missing")
		}
	}
}

func TestTransactionsCommitAndRollback(t *testing.T) {
	c := dial(t)
	ch := channel(t, c)
	q := tempQueue(t, ch)
	if err := ch.Tx(); err != nil {
		t.Fatal(err)
	}
	publish(t, ch, "", q, amqp.Publishing{Body: []byte("rolled back")})
	if err := ch.TxRollback(); err != nil {
		t.Fatal(err)
	}
	publish(t, ch, "", q, amqp.Publishing{Body: []byte("committed")})
	if err := ch.TxCommit(); err != nil {
		t.Fatal(err)
	}
	if got := string(getOne(t, ch, q, true).Body); got != "committed" {
		t.Fatalf("got %q", got)
	}
	if err := ch.Confirm(false); err == nil {
		t.Fatal("confirm.select on a tx channel succeeded")
	} else {
		expectAMQPError(t, err, 406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode")
	}
}

func TestLargeMessageSpanningManyFrames(t *testing.T) {
	c, err := amqp.DialConfig(brokerURI, amqp.Config{FrameSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch := channel(t, c)
	q := tempQueue(t, ch)
	body := make([]byte, 3*1024*1024+17)
	for i := range body {
		body[i] = byte(i * 31)
	}
	publish(t, ch, "", q, amqp.Publishing{Body: body})
	publish(t, ch, "", q, amqp.Publishing{Body: []byte{}})
	if got := getOne(t, ch, q, true).Body; !bytes.Equal(got, body) {
		t.Fatalf("large body differs: %d bytes", len(got))
	}
	if got := getOne(t, ch, q, true).Body; len(got) != 0 {
		t.Fatalf("empty body came back as %d bytes", len(got))
	}
}

// Field types pika cannot send (floats, small ints, uint fields, decimals) round-trip unchanged.
func TestHeaderTableWithEveryGoFieldTypeRoundTrips(t *testing.T) {
	ch := channel(t, dial(t))
	q := tempQueue(t, ch)
	ts := time.Unix(1700000000, 0).UTC()
	headers := amqp.Table{
		"bool": true, "int8": int8(-8), "byte": byte(200), "int16": int16(-1600), "uint16": uint16(65000),
		"int32": int32(-320000), "uint32": uint32(4000000000), "int64": int64(math.MinInt64),
		"float32": float32(1.5), "float64": float64(-2.25), "string": "s", "bytes": []byte{0, 1, 255},
		"decimal": amqp.Decimal{Scale: 3, Value: 31415}, "time": ts, "void": nil,
		"table": amqp.Table{"nested": amqp.Table{"k": "v"}},
		"array": []interface{}{int32(1), "two", nil, float64(3.5), []interface{}{true}},
	}
	msg := amqp.Publishing{
		Headers: headers, ContentType: "application/octet-stream", ContentEncoding: "identity",
		DeliveryMode: 2, Priority: 3, CorrelationId: "corr", ReplyTo: "reply", Expiration: "60000",
		MessageId: "mid", Timestamp: ts, Type: "t", UserId: "guest", AppId: "go-interop",
		Body: []byte("props"),
	}
	publish(t, ch, "", q, msg)
	d := getOne(t, ch, q, true)
	if tm, ok := d.Headers["time"].(time.Time); ok {
		d.Headers["time"] = tm.UTC() // the client decodes timestamps in local time
	}
	if !reflect.DeepEqual(d.Headers, headers) {
		t.Fatalf("headers differ:\n got  %#v\n want %#v", d.Headers, headers)
	}
	got := amqp.Publishing{Headers: d.Headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		DeliveryMode: d.DeliveryMode, Priority: d.Priority, CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo,
		Expiration: d.Expiration, MessageId: d.MessageId, Timestamp: d.Timestamp.UTC(), Type: d.Type,
		UserId: d.UserId, AppId: d.AppId, Body: d.Body}
	if !reflect.DeepEqual(got, msg) {
		t.Fatalf("properties differ:\n got  %#v\n want %#v", got, msg)
	}
}
