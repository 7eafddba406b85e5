package interop

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Clients use no-wait declares and binds: the broker must act on them without answering.
func TestNoWaitDeclareBindAndConsumeTakeEffect(t *testing.T) {
	ch := channel(t, dial(t))
	name := uniqueName(t)
	if err := ch.ExchangeDeclare(name, "fanout", false, true, false, true, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(name, false, true, false, true, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(name, "", name, true, nil); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(name, "nowait-consumer", true, false, false, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	publish(t, ch, name, "any", amqp.Publishing{Body: []byte("via nowait topology")})
	if got := string(receive(t, deliveries).Body); got != "via nowait topology" {
		t.Fatalf("got %q", got)
	}
	if err := ch.Cancel("nowait-consumer", true); err != nil {
		t.Fatal(err)
	}
	_ = ch.ExchangeDelete(name, false, false)
}

func TestNoWaitDeclareErrorStillClosesTheChannel(t *testing.T) {
	ch := channel(t, dial(t))
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	name := uniqueName(t)
	if _, err := ch.QueueDeclare(name, false, true, false, true, amqp.Table{"x-max-length": "ten"}); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-closed:
		expectAMQPError(t, e, 406, "PRECONDITION_FAILED - invalid arg 'x-max-length' for queue '"+name+"'")
	case <-time.After(waitTimeout):
		t.Fatal("channel not closed after an invalid no-wait declare")
	}
}

func TestClientHeartbeatsKeepAnIdleConnectionOpen(t *testing.T) {
	c, err := amqp.DialConfig(brokerURI, amqp.Config{Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(3500 * time.Millisecond)
	if c.IsClosed() {
		t.Fatal("connection closed while heartbeating")
	}
	channel(t, c)
}
