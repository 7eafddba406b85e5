package interop

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestConsumerCancelNotificationWhenQueueIsDeleted(t *testing.T) {
	ch := channel(t, dial(t))
	name := uniqueName(t)
	if _, err := ch.QueueDeclare(name, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	cancels := ch.NotifyCancel(make(chan string, 1))
	if _, err := ch.Consume(name, "watched", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := channel(t, dial(t)).QueueDelete(name, false, false, false); err != nil {
		t.Fatal(err)
	}
	select {
	case tag := <-cancels:
		if tag != "watched" {
			t.Fatalf("cancelled %q", tag)
		}
	case <-time.After(waitTimeout):
		t.Fatal("no basic.cancel from the broker")
	}
	if ch.IsClosed() {
		t.Fatal("channel closed by a cancel notification")
	}
}

func TestExclusiveConsumerRefusesSecondConsumerWith403(t *testing.T) {
	c := dial(t)
	ch := channel(t, c)
	q := tempQueue(t, ch)
	if _, err := ch.Consume(q, "", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	_, err := channel(t, c).Consume(q, "", false, false, false, false, nil)
	expectAMQPError(t, err, 403, "ACCESS_REFUSED - queue '"+q+"' in vhost '/' in exclusive use")
}

func TestConsumerTagReuseIsConnectionError530(t *testing.T) {
	c := dial(t)
	ch := channel(t, c)
	q := tempQueue(t, ch)
	if _, err := ch.Consume(q, "dup", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	closed := c.NotifyClose(make(chan *amqp.Error, 1))
	_, _ = ch.Consume(q, "dup", false, false, false, false, nil)
	select {
	case e := <-closed:
		expectAMQPError(t, e, 530, "NOT_ALLOWED - attempt to reuse consumer tag 'dup'")
	case <-time.After(waitTimeout):
		t.Fatal("connection not closed")
	}
}

func TestConsumerPriorityPrefersHigherPriorityConsumer(t *testing.T) {
	ch := channel(t, dial(t))
	q := tempQueue(t, ch)
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	low, _ := ch.Consume(q, "low", false, false, false, false, amqp.Table{"x-priority": int32(1)})
	high, _ := ch.Consume(q, "high", false, false, false, false, amqp.Table{"x-priority": int32(5)})
	publish(t, ch, "", q, amqp.Publishing{Body: []byte("first")})
	d := receive(t, high)
	publish(t, ch, "", q, amqp.Publishing{Body: []byte("second")})
	d2 := receive(t, low) // high is at its prefetch limit
	if string(d.Body) != "first" || string(d2.Body) != "second" {
		t.Fatalf("got %q then %q", d.Body, d2.Body)
	}
}

func TestDirectReplyTo(t *testing.T) {
	client := channel(t, dial(t))
	replies, err := client.Consume("amq.rabbitmq.reply-to", "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	server := channel(t, dial(t))
	q := tempQueue(t, server)
	publish(t, client, "", q, amqp.Publishing{ReplyTo: "amq.rabbitmq.reply-to", Body: []byte("ping")})
	req := getOne(t, server, q, true)
	if len(req.ReplyTo) <= len("amq.rabbitmq.reply-to.") {
		t.Fatalf("reply-to not rewritten: %q", req.ReplyTo)
	}
	publish(t, server, "", req.ReplyTo, amqp.Publishing{Body: []byte("pong")})
	if got := string(receive(t, replies).Body); got != "pong" {
		t.Fatalf("reply %q", got)
	}
}

func TestUpdateSecretIsAcknowledged(t *testing.T) {
	c := dial(t)
	u, _ := amqp.ParseURI(brokerURI)
	if err := c.UpdateSecret(u.Password, "rotation"); err != nil {
		t.Fatal(err)
	}
	channel(t, c)
}

func TestChannelFlowActiveIsAcknowledged(t *testing.T) {
	ch := channel(t, dial(t))
	if err := ch.Flow(true); err != nil {
		t.Fatal(err)
	}
}

func TestRecoverRequeueRedelivers(t *testing.T) {
	ch := channel(t, dial(t))
	q := tempQueue(t, ch)
	publish(t, ch, "", q, amqp.Publishing{Body: []byte("again")})
	deliveries, _ := ch.Consume(q, "", false, false, false, false, nil)
	receive(t, deliveries)
	if err := ch.Recover(true); err != nil {
		t.Fatal(err)
	}
	if d := receive(t, deliveries); !d.Redelivered {
		t.Fatal("not marked redelivered")
	}
}

func TestQuorumQueueDeclareAndDeliveryCount(t *testing.T) {
	ch := channel(t, dial(t))
	name := uniqueName(t)
	if _, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	defer ch.QueueDelete(name, false, false, false)
	publish(t, ch, "", name, amqp.Publishing{Body: []byte("q")})
	d := getOne(t, ch, name, false)
	_ = d.Nack(false, true)
	d = getOne(t, ch, name, false)
	if !d.Redelivered || d.Headers["x-delivery-count"] != int64(1) {
		t.Fatalf("redelivered=%v headers=%#v", d.Redelivered, d.Headers)
	}
	_ = d.Ack(false)
}

func TestNonDurableQuorumQueueIs406(t *testing.T) {
	ch := channel(t, dial(t))
	name := uniqueName(t)
	_, err := ch.QueueDeclare(name, false, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	expectAMQPError(t, err, 406, "PRECONDITION_FAILED - invalid property 'non-durable' for queue '"+name+"'")
}
