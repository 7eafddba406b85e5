package interop

// AMQP over TLS with amqp091-go: PLAIN and EXTERNAL logins with a client certificate, against a
// node of the test's own configured with certificates the test makes (no key is committed):
// warren with --tls-listen, or a second RabbitMQ node started through rabbitmq.sh with the same
// settings in RMQ_EXTRA_CONF and the rabbitmq_auth_mechanism_ssl plugin.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	tlsClientCN  = "warren-go-tls-client"
	tlsClientOrg = "warren-tests"
	// RabbitMQ's distinguished_name login: the subject, most specific RDN first.
	tlsClientDN = "CN=" + tlsClientCN + ",O=" + tlsClientOrg
)

type issued struct {
	cert     *x509.Certificate
	key      *ecdsa.PrivateKey
	certPath string
	keyPath  string
}

func issue(t *testing.T, dir, stem string, subject pkix.Name, parent *issued, isCA, server bool) *issued {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               subject,
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		BasicConstraintsValid: true,
		IsCA:                  isCA,
	}
	switch {
	case isCA:
		tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	case server:
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	default:
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	}
	parentCert, parentKey := tmpl, key
	if parent != nil {
		parentCert, parentKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parentCert, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	keyDER, _ := x509.MarshalPKCS8PrivateKey(key)
	out := &issued{cert: cert, key: key,
		certPath: filepath.Join(dir, stem+".pem"), keyPath: filepath.Join(dir, stem+".key")}
	writePEM(t, out.certPath, "CERTIFICATE", der)
	writePEM(t, out.keyPath, "PRIVATE KEY", keyDER)
	return out
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

type tlsNode struct {
	amqpsAddr string
	provision func(user string) error
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func waitListening(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(brokerStartTimeout)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond); err == nil {
			c.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("nothing listens on %s after %s", addr, brokerStartTimeout)
}

// startTLSNode starts a node with verify_peer, fail_if_no_peer_cert and EXTERNAL, stopped when
// the test ends.
func startTLSNode(t *testing.T, dir string, ca, server *issued) tlsNode {
	t.Helper()
	if brokerKind == "rabbitmq" {
		script := os.Getenv("RABBITMQ_SH")
		if script == "" {
			script = filepath.Join("..", "..", "..", "..", "shared", "rabbitmq", "rabbitmq.sh")
		}
		port := 5694
		if p, err := strconv.Atoi(os.Getenv("WARREN_TLS_GO_RMQ_PORT")); err == nil {
			port = p
		}
		conf := fmt.Sprintf("listeners.ssl.default = 127.0.0.1:%d\nssl_options.cacertfile = %s\n"+
			"ssl_options.certfile = %s\nssl_options.keyfile = %s\nssl_options.verify = verify_peer\n"+
			"ssl_options.fail_if_no_peer_cert = true\nauth_mechanisms.1 = PLAIN\n"+
			"auth_mechanisms.2 = EXTERNAL\nssl_cert_login_from = distinguished_name",
			port+1, ca.certPath, server.certPath, server.keyPath)
		env := append(os.Environ(), fmt.Sprintf("RMQ_PORT=%d", port),
			fmt.Sprintf("RMQ_DIST_PORT=%d", port+20000), "RMQ_STATE="+filepath.Join(dir, "rabbitmq"),
			"RMQ_PLUGINS=rabbitmq_auth_mechanism_ssl", "RMQ_EXTRA_CONF="+conf)
		run := func(args ...string) error {
			cmd := exec.Command(script, args...)
			cmd.Env = env
			out, err := cmd.CombinedOutput()
			if err != nil {
				return fmt.Errorf("rabbitmq.sh %v: %v: %s", args, err, out)
			}
			return nil
		}
		if err := run("start"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = run("stop") })
		addr := fmt.Sprintf("127.0.0.1:%d", port+1)
		waitListening(t, addr)
		return tlsNode{amqpsAddr: addr, provision: func(user string) error {
			if err := run("ctl", "1", "add_user", user, "unused"); err != nil {
				return err
			}
			return run("ctl", "1", "set_permissions", "-p", "/", user, ".*", ".*", ".*")
		}}
	}
	bin := os.Getenv("WARREN_BIN")
	if bin == "" {
		bin = filepath.Join("..", "..", "..", "target", "release", "warren")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no warren binary at %s", bin)
	}
	amqps, mgmt := freeAddr(t), freeAddr(t)
	cmd := exec.Command(bin, "server", "--listen", "none", "--data-dir", filepath.Join(dir, "data"),
		"--management-listen", mgmt, "--tls-listen", amqps, "--tls-cert", server.certPath,
		"--tls-key", server.keyPath, "--tls-ca", ca.certPath, "--tls-verify-peer",
		"--tls-fail-if-no-peer-cert", "--auth-mechanisms", "PLAIN,EXTERNAL")
	if logFile, err := os.Create(filepath.Join(dir, "warren.log")); err == nil {
		cmd.Stdout, cmd.Stderr = logFile, logFile
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_, _ = cmd.Process.Wait()
	})
	waitListening(t, amqps)
	waitListening(t, mgmt)
	ctl := func(args ...string) error {
		out, err := exec.Command(bin, append([]string{"ctl", "--uri", "http://guest:guest@" + mgmt}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("warren ctl %v: %v: %s", args, err, out)
		}
		return nil
	}
	return tlsNode{amqpsAddr: amqps, provision: func(user string) error {
		if err := ctl("add_user", user, "unused"); err != nil {
			return err
		}
		return ctl("set_permissions", "-p", "/", user, ".*", ".*", ".*")
	}}
}

func TestTLSWithClientCertificates(t *testing.T) {
	dir := t.TempDir()
	ca := issue(t, dir, "ca", pkix.Name{CommonName: "warren go test CA"}, nil, true, false)
	otherCA := issue(t, dir, "other-ca", pkix.Name{CommonName: "warren go untrusted CA"}, nil, true, false)
	server := issue(t, dir, "server", pkix.Name{CommonName: "localhost"}, ca, false, true)
	client := issue(t, dir, "client",
		pkix.Name{CommonName: tlsClientCN, Organization: []string{tlsClientOrg}}, ca, false, false)
	node := startTLSNode(t, dir, ca, server)

	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	clientPair := tls.Certificate{Certificate: [][]byte{client.cert.Raw}, PrivateKey: client.key}
	config := func(version uint16) *tls.Config {
		return &tls.Config{RootCAs: roots, ServerName: "localhost", MinVersion: version,
			MaxVersion: version, Certificates: []tls.Certificate{clientPair}}
	}
	roundtrip := func(t *testing.T, c *amqp.Connection, userID string) {
		ch := channel(t, c)
		q := tempQueue(t, ch)
		publish(t, ch, "", q, amqp.Publishing{Body: []byte("over tls"), UserId: userID})
		if d := getOne(t, ch, q, true); string(d.Body) != "over tls" || d.UserId != userID {
			t.Fatalf("got %q from %q", d.Body, d.UserId)
		}
	}

	for _, v := range []struct {
		name    string
		version uint16
	}{{"tls1.2", tls.VersionTLS12}, {"tls1.3", tls.VersionTLS13}} {
		t.Run("plain login over "+v.name, func(t *testing.T) {
			c, err := amqp.DialTLS("amqps://guest:guest@"+node.amqpsAddr+"/", config(v.version))
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer c.Close()
			if got := c.ConnectionState().Version; got != v.version {
				t.Fatalf("negotiated TLS version %x, want %x", got, v.version)
			}
			roundtrip(t, c, "guest")
		})
	}

	t.Run("external login as the certificate's DN", func(t *testing.T) {
		if err := node.provision(tlsClientDN); err != nil {
			t.Fatal(err)
		}
		c, err := amqp.DialTLS_ExternalAuth("amqps://"+node.amqpsAddr+"/", config(tls.VersionTLS13))
		if err != nil {
			t.Fatalf("dial with EXTERNAL: %v", err)
		}
		defer c.Close()
		roundtrip(t, c, tlsClientDN)
	})

	t.Run("a server the client does not trust is refused", func(t *testing.T) {
		untrusting := x509.NewCertPool()
		untrusting.AddCert(otherCA.cert)
		cfg := config(tls.VersionTLS13)
		cfg.RootCAs = untrusting
		start := time.Now()
		if c, err := amqp.DialTLS("amqps://guest:guest@"+node.amqpsAddr+"/", cfg); err == nil {
			c.Close()
			t.Fatal("connected to a server signed by a CA the client does not trust")
		}
		if time.Since(start) > 4*time.Second {
			t.Fatalf("refusal took %s", time.Since(start))
		}
	})
}
