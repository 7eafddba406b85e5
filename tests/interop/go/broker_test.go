// Package interop drives a broker with amqp091-go, the official Go client.
//
// The broker comes from the same environment as the Python suite:
//   - WARREN_TEST_BROKER=rabbitmq: WARREN_TEST_URI (default amqp://guest:guest@127.0.0.1:5680/)
//     points at a running RabbitMQ.
//   - WARREN_TEST_BROKER=warren (default): WARREN_TEST_URI if set, otherwise TestMain starts
//     WARREN_BIN (default ../../../target/release/warren) on a free port with a fresh data dir.
package interop

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	brokerStartTimeout = 30 * time.Second
	// How long a test waits for a message or an event before failing: a deadline, not a
	// delay (the waits end as soon as it comes), so it is generous, for a loaded machine.
	waitTimeout = 15 * time.Second
)

var (
	brokerKind string
	brokerURI  string
)

func TestMain(m *testing.M) {
	brokerKind = os.Getenv("WARREN_TEST_BROKER")
	if brokerKind == "" {
		brokerKind = "warren"
	}
	brokerURI = os.Getenv("WARREN_TEST_URI")
	var proc *exec.Cmd
	switch {
	case brokerKind == "rabbitmq" && brokerURI == "":
		brokerURI = "amqp://guest:guest@127.0.0.1:5680/"
	case brokerKind == "warren" && brokerURI == "":
		var err error
		proc, brokerURI, err = startWarren()
		if err != nil {
			fmt.Fprintln(os.Stderr, "cannot start warren:", err)
			os.Exit(1)
		}
	case brokerKind != "warren" && brokerKind != "rabbitmq":
		fmt.Fprintln(os.Stderr, "unknown WARREN_TEST_BROKER", brokerKind)
		os.Exit(2)
	}
	code := m.Run()
	if proc != nil {
		_ = proc.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- proc.Wait() }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = proc.Process.Kill()
		}
	}
	os.Exit(code)
}

func startWarren() (*exec.Cmd, string, error) {
	bin := os.Getenv("WARREN_BIN")
	if bin == "" {
		bin = filepath.Join("..", "..", "..", "target", "release", "warren")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	addr := l.Addr().String()
	l.Close()
	dataDir, err := os.MkdirTemp("", "warren-go-interop-")
	if err != nil {
		return nil, "", err
	}
	cmd := exec.Command(bin, "server", "--listen", addr, "--data-dir", dataDir, "--management-listen", "none")
	logFile, err := os.Create(filepath.Join(dataDir, "..", filepath.Base(dataDir)+".log"))
	if err == nil {
		cmd.Stdout, cmd.Stderr = logFile, logFile
	}
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	deadline := time.Now().Add(brokerStartTimeout)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond); err == nil {
			c.Close()
			return cmd, "amqp://guest:guest@" + addr + "/", nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	return nil, "", fmt.Errorf("warren did not listen on %s within %s", addr, brokerStartTimeout)
}

func hostPort() string {
	u, err := amqp.ParseURI(brokerURI)
	if err != nil {
		panic(err)
	}
	return fmt.Sprintf("%s:%d", u.Host, u.Port)
}

func dial(t *testing.T) *amqp.Connection {
	t.Helper()
	c, err := amqp.DialConfig(brokerURI, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		t.Fatalf("dial %s: %v", brokerURI, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func channel(t *testing.T, c *amqp.Connection) *amqp.Channel {
	t.Helper()
	ch, err := c.Channel()
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	return ch
}

func uniqueName(t *testing.T) string {
	return fmt.Sprintf("interop-go.%s.%d", t.Name(), time.Now().UnixNano())
}

func tempQueue(t *testing.T, ch *amqp.Channel) string {
	t.Helper()
	q, err := ch.QueueDeclare("", false, false, true, false, nil)
	if err != nil {
		t.Fatalf("declare: %v", err)
	}
	return q.Name
}

// expectAMQPError asserts that err is the broker's close with this code and text prefix.
func expectAMQPError(t *testing.T, err error, code int, textPrefix string) {
	t.Helper()
	var amqpErr *amqp.Error
	if !errors.As(err, &amqpErr) {
		t.Fatalf("expected AMQP error %d %q, got %v", code, textPrefix, err)
	}
	if amqpErr.Code != code || !strings.HasPrefix(amqpErr.Reason, textPrefix) {
		t.Fatalf("expected %d %q..., got %d %q", code, textPrefix, amqpErr.Code, amqpErr.Reason)
	}
}

// getOne polls basic.get until a message arrives or the wait runs out.
func getOne(t *testing.T, ch *amqp.Channel, queue string, autoAck bool) amqp.Delivery {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		d, ok, err := ch.Get(queue, autoAck)
		if err != nil {
			t.Fatalf("get %s: %v", queue, err)
		}
		if ok {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("no message in %s after %s", queue, waitTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func receive(t *testing.T, deliveries <-chan amqp.Delivery) amqp.Delivery {
	t.Helper()
	select {
	case d, ok := <-deliveries:
		if !ok {
			t.Fatal("delivery channel closed")
		}
		return d
	case <-time.After(waitTimeout):
		t.Fatalf("no delivery after %s", waitTimeout)
	}
	return amqp.Delivery{}
}

func publish(t *testing.T, ch *amqp.Channel, exchange, key string, msg amqp.Publishing) {
	t.Helper()
	if err := ch.Publish(exchange, key, false, false, msg); err != nil {
		t.Fatalf("publish: %v", err)
	}
}
