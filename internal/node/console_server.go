package node

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/log"
)

// serve answers the API server's node proxy, like a kubelet does for
// `kubectl logs`:
//
//	GET /v1/machines/{namespace}/{name}/console?tail=N&follow=true (N at most maxTailLines)
//	POST /v1/machines/{namespace}/{name}/exec, /files/read, /files/write, /console/attach (exec_server.go)
//	GET /healthz
//
// A console request needs a client certificate from --client-ca-file or a
// bearer token, and get on machines/console in the Machine's namespace
// (console_authz.go). Saved states of cold migrations are not served here
// any more, only over the migration listener to the migration's target
// node (migration_state.go).
func (a *Agent) serve(ctx context.Context) error {
	cert, err := servingCert(filepath.Join(a.opts.StateDir, "tls"), a.opts.NodeName)
	if err != nil {
		return err
	}
	tlsConfig := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if a.opts.ClientCAFile != "" {
		pemData, err := os.ReadFile(a.opts.ClientCAFile)
		if err != nil {
			return fmt.Errorf("--client-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pemData) {
			return fmt.Errorf("--client-ca-file %s holds no PEM certificate", a.opts.ClientCAFile)
		}
		tlsConfig.ClientCAs = pool
		// A certificate, if sent, must verify; without one a request may
		// still bring a bearer token, and gets 401 otherwise.
		tlsConfig.ClientAuth = tls.VerifyClientCertIfGiven
	}
	server := &http.Server{
		Handler:           a.handler(),
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         tlsConfig,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = server.Shutdown(shutdown)
	}()
	log.FromContext(ctx).Info("serving consoles", "address", a.listenAddr)
	if err := server.ServeTLS(a.listener, "", ""); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// handler routes the server's requests.
func (a *Agent) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("GET /v1/machines/{namespace}/{name}/console", a.serveConsole)
	a.execRoutes(mux) // exec, file copy and console attach: exec_server.go
	return mux
}

// serveConsole answers with the console log; tail is at most maxTailLines
// (a larger one is taken as that) and read from the end of the file. The
// requester is authenticated (401), the names checked (400), and the
// requester authorized for this Machine's console (403), in that order.
func (a *Agent) serveConsole(w http.ResponseWriter, r *http.Request) {
	user, ok := a.consoleAuth.authenticate(w, r)
	if !ok {
		return
	}
	namespace, name, ok := requestNames(w, r)
	if !ok {
		return
	}
	if !a.consoleAuth.authorize(w, r, user, readConsole, namespace, name) {
		return
	}
	id := instanceID(namespace, name)
	tail := -1
	if text := r.URL.Query().Get("tail"); text != "" {
		n, err := strconv.ParseUint(text, 10, 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			http.Error(w, "tail must be a non-negative number of lines", http.StatusBadRequest)
			return
		}
		tail = int(min(n, maxTailLines))
		if errors.Is(err, strconv.ErrRange) {
			tail = maxTailLines
		}
	}
	follow := r.URL.Query().Get("follow") == "true"
	file, err := os.Open(a.opts.Backend.ConsoleLog(id))
	if err != nil {
		http.Error(w, fmt.Sprintf("no console for machine %s/%s on node %s", namespace, name, a.opts.NodeName), http.StatusNotFound)
		return
	}
	defer file.Close()

	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if tail >= 0 {
		if err := seekToLastLines(file, tail); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	}
	if _, err := io.Copy(w, file); err != nil || !follow {
		return
	}
	flusher, _ := w.(http.Flusher)
	for {
		if flusher != nil {
			flusher.Flush()
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
		if _, err := io.Copy(w, file); err != nil {
			return
		}
	}
}

// servingCert loads or creates the agent's self-signed serving certificate.
// The API server's node proxy does not verify it unless configured to, as
// with kubelets.
func servingCert(dir, nodeName string) (tls.Certificate, error) {
	certFile, keyFile := filepath.Join(dir, "serving.crt"), filepath.Join(dir, "serving.key")
	if cert, err := tls.LoadX509KeyPair(certFile, keyFile); err == nil {
		return cert, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	template := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: nodeName},
		DNSNames:     []string{nodeName, "localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().AddDate(10, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return tls.Certificate{}, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return tls.Certificate{}, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	if err := os.WriteFile(certFile, certPEM, 0o644); err != nil {
		return tls.Certificate{}, err
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(certPEM, keyPEM)
}
