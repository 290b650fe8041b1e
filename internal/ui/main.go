package ui

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Main is the kairon-ui command: it parses args, serves until ctx ends and
// returns the exit code. It prints "kairon-ui: serving http://ADDR ..." on
// stdout (https with --tls-cert-file) once the cache is filled and the address listens.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kairon-ui", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the cluster to show (default: $KUBECONFIG, ~/.kube/config, then the in-cluster config)")
	listen := fs.String("listen", "127.0.0.1:8090", "address to serve the dashboard and the API on")
	auth := fs.String("auth", "auto", "who requests act as: token (each request's own bearer token, from an Authorization header or the login page), kubeconfig (the identity kairon-ui runs with), or auto (token with the in-cluster config, kubeconfig otherwise)")
	allowWrite := fs.Bool("allow-write", false, "turn the actions on (evacuate a node, migrate a Machine, scale a pool), made with the user's identity")
	tlsCert := fs.String("tls-cert-file", "", "serve HTTPS with this PEM certificate (chain); needs --tls-private-key-file. Read once at start")
	tlsKey := fs.String("tls-private-key-file", "", "the PEM private key of --tls-cert-file")
	allowNonLoopback := fs.Bool("allow-non-loopback", false, "with --auth kubeconfig: listen on a non-loopback --listen address, so that whoever reaches it acts as the kubeconfig's identity")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: kairon-ui [flags]\n\nServes Kairon's web dashboard and its JSON API (/api/v1/...);\nsee docs/guides/ui.md.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kairon-ui: unexpected arguments %q\n", fs.Args())
		return 2
	}
	mode := AuthMode(*auth)
	switch *auth {
	case "auto":
		mode = AuthKubeconfig
		if *kubeconfig == "" && os.Getenv("KUBECONFIG") == "" && os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
			mode = AuthToken
		}
	case string(AuthKubeconfig), string(AuthToken):
	default:
		fmt.Fprintf(stderr, "kairon-ui: --auth %q: use token, kubeconfig or auto\n", *auth)
		return 2
	}
	host, _, err := net.SplitHostPort(*listen)
	if err != nil {
		fmt.Fprintf(stderr, "kairon-ui: --listen %q: %v\n", *listen, err)
		return 2
	}
	if mode == AuthKubeconfig && !isLoopback(host) && !*allowNonLoopback {
		fmt.Fprintf(stderr, "kairon-ui: refusing --listen %s with --auth kubeconfig: whoever reaches a non-loopback address would act as the kubeconfig's identity. Listen on 127.0.0.1, use --auth token, or add --allow-non-loopback.\n", *listen)
		return 2
	}
	if (*tlsCert == "") != (*tlsKey == "") {
		fmt.Fprintln(stderr, "kairon-ui: --tls-cert-file and --tls-private-key-file go together")
		return 2
	}
	var tlsConfig *tls.Config
	if *tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(*tlsCert, *tlsKey)
		if err != nil {
			fmt.Fprintf(stderr, "kairon-ui: loading --tls-cert-file %s and --tls-private-key-file %s: %v\n", *tlsCert, *tlsKey, err)
			return 2
		}
		tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	opts := Options{Auth: mode, AllowWrite: *allowWrite}
	if err := serve(ctx, *kubeconfig, *listen, tlsConfig, opts, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "kairon-ui:", err)
		return 1
	}
	return 0
}

func serve(ctx context.Context, kubeconfig, listen string, tlsConfig *tls.Config, opts Options, stdout, stderr io.Writer) error {
	cfg, err := restConfig(kubeconfig)
	if err != nil {
		return err
	}
	srv, err := New(cfg, opts)
	if err != nil {
		return err
	}
	if err := srv.Start(ctx); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	if host, _, _ := net.SplitHostPort(listen); !isLoopback(host) && opts.Auth == AuthKubeconfig {
		fmt.Fprintf(stderr, "kairon-ui: warning: listening on %s, not loopback (--allow-non-loopback): whoever reaches it acts as this kubeconfig's identity\n", listen)
	}
	writes := "actions off"
	if opts.AllowWrite {
		writes = "actions on"
	}
	scheme := "http"
	if tlsConfig != nil {
		scheme = "https"
	}
	fmt.Fprintf(stdout, "kairon-ui: serving %s://%s (API server %s, auth %s, %s)\n", scheme, ln.Addr(), cfg.Host, opts.Auth, writes)
	hs := &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		// No write timeout: /api/v1/events streams while a page is open.
		// Requests get ctx, so the streams end when the server stops.
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	errc := make(chan error, 1)
	if tlsConfig != nil {
		// ServeTLS offers HTTP/2 (h2) besides HTTP/1.1, so the event
		// streams of many open pages share one connection. The login
		// cookie is Secure on a request that came over TLS.
		hs.TLSConfig = tlsConfig
		go func() { errc <- hs.ServeTLS(ln, "", "") }()
	} else {
		go func() { errc <- hs.Serve(ln) }()
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(shutdown); err != nil {
		return fmt.Errorf("stopping: %w", err)
	}
	return nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// restConfig loads kubeconfig, or kubectl's defaults, or the in-cluster
// config.
func restConfig(path string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("finding the API server (set --kubeconfig or $KUBECONFIG): %w", err)
	}
	return cfg, nil
}
