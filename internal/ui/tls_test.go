package ui_test

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/ui"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kairon-ui test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// serving writes a serving certificate for 127.0.0.1 signed by the CA and
// its key into dir, and returns their paths.
func (ca *testCA) serving(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kairon-ui"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// TestTLS runs the command with --tls-cert-file and --tls-private-key-file
// (a serving certificate of a CA made for the test): it prints an https
// URL, a client trusting the CA gets answers over TLS, one that does not
// trust it is refused, plain HTTP gets nothing, and the login cookie is
// Secure without any proxy header.
func TestTLS(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ca := newTestCA(t)
	certFile, keyFile := ca.serving(t, t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- ui.Main(ctx, []string{"--kubeconfig", env.Kubeconfig, "--auth", "token", "--listen", "127.0.0.1:0",
			"--tls-cert-file", certFile, "--tls-private-key-file", keyFile}, &stdout, &stderr)
	}()
	var url string
	testenv.Eventually(t, time.Minute, "kairon-ui to print its URL", func() (bool, string) {
		select {
		case code := <-done:
			t.Fatalf("kairon-ui exited %d: %s", code, stderr.String())
		default:
		}
		_, rest, ok := strings.Cut(stdout.String(), "kairon-ui: serving ")
		if !ok {
			return false, stdout.String()
		}
		url, _, _ = strings.Cut(rest, " ")
		return true, stdout.String()
	})
	if !strings.HasPrefix(url, "https://127.0.0.1:") {
		t.Fatalf("kairon-ui with a certificate serves %q, want https://127.0.0.1:PORT", url)
	}

	trusting := &http.Client{
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS12}, ForceAttemptHTTP2: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       30 * time.Second,
	}
	resp, err := trusting.Get(url + "/healthz")
	if err != nil {
		t.Fatalf("GET /healthz over TLS: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.TLS == nil || resp.TLS.PeerCertificates[0].Subject.CommonName != "kairon-ui" || resp.ProtoMajor != 2 {
		t.Errorf("GET /healthz over TLS: %s, %s, TLS %v", resp.Status, resp.Proto, resp.TLS != nil)
	}
	// A client that does not trust the CA is refused by its own checks.
	if _, err := (&http.Client{Timeout: 30 * time.Second}).Get(url + "/healthz"); err == nil || !errors.As(err, new(*tls.CertificateVerificationError)) {
		t.Errorf("GET over TLS without the test CA: %v, want an unknown authority", err)
	}
	// Plain HTTP on the TLS port gets no page.
	if resp, err := (&http.Client{Timeout: 30 * time.Second}).Get("http://" + strings.TrimPrefix(url, "https://") + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("plain HTTP on the TLS port answered 200")
		}
	}

	// Signing in over TLS: the cookie is Secure, with no proxy header.
	token := serviceAccount(t, env, ns, "viewer")
	grantCluster(t, env, ns, "viewer", readRules)
	req, _ := http.NewRequest(http.MethodPost, url+"/login", strings.NewReader(neturlValues("token", token, "next", "/nodes")))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err = trusting.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cs := resp.Cookies()
	if resp.StatusCode != http.StatusSeeOther || len(cs) != 1 || !cs[0].Secure || !cs[0].HttpOnly {
		t.Fatalf("login over TLS: %s, cookies %+v, want one Secure HttpOnly cookie", resp.Status, cs)
	}
	req, _ = http.NewRequest(http.MethodGet, url+"/api/v1/nodes", nil)
	req.AddCookie(cs[0])
	resp, err = trusting.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/api/v1/nodes over TLS with the login cookie: %s", resp.Status)
	}

	// The event stream over HTTP/2: a Machine created shows as a change.
	streamCtx, stopStream := context.WithTimeout(context.Background(), 30*time.Second)
	defer stopStream()
	req, _ = http.NewRequestWithContext(streamCtx, http.MethodGet, url+"/api/v1/events", nil)
	req.AddCookie(cs[0])
	stream, err := (&http.Client{Transport: trusting.Transport}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	if stream.StatusCode != http.StatusOK || stream.ProtoMajor != 2 || stream.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("the event stream over TLS: %s %s %q", stream.Status, stream.Proto, stream.Header.Get("Content-Type"))
	}
	lines := bufio.NewScanner(stream.Body)
	if !lines.Scan() || lines.Text() != ": connected" {
		t.Fatalf("the event stream began with %q", lines.Text())
	}
	machine(t, env, ns, "over-tls", "", "", nil)
	changed := false
	for !changed && lines.Scan() {
		changed = strings.HasPrefix(lines.Text(), "data: ") && strings.Contains(lines.Text(), `"machines"`)
	}
	if !changed {
		t.Fatalf("the event stream over TLS sent no change of machines within 30 s: %v", lines.Err())
	}
	stopStream()

	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("kairon-ui exited %d: %s", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("kairon-ui did not stop within 10 s of its context ending")
	}

	// One of the two flags alone, or a key that does not load, is a usage
	// error before anything starts.
	var out syncBuffer
	if code := ui.Main(context.Background(), []string{"--kubeconfig", env.Kubeconfig, "--tls-cert-file", certFile}, &out, &out); code != 2 || !strings.Contains(out.String(), "go together") {
		t.Errorf("--tls-cert-file alone: exit %d, %s", code, out.String())
	}
	out = syncBuffer{}
	if code := ui.Main(context.Background(), []string{"--kubeconfig", env.Kubeconfig, "--tls-cert-file", certFile, "--tls-private-key-file", certFile}, &out, &out); code != 2 || !strings.Contains(out.String(), "loading --tls-cert-file") {
		t.Errorf("a certificate for a key: exit %d, %s", code, out.String())
	}
}
