package ui

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Main is the kairon-ui command: it parses args, serves until ctx ends and
// returns the exit code. It prints "kairon-ui: serving http://ADDR ..." on
// stdout once the cache is filled and the address listens.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kairon-ui", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the cluster to show (default: $KUBECONFIG, ~/.kube/config, then the in-cluster config)")
	listen := fs.String("listen", "127.0.0.1:8090", "address to serve the dashboard and the API on; the UI has no login yet, so keep it on loopback")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: kairon-ui [flags]\n\nServes Kairon's read-only web dashboard and its JSON API (/api/v1/...);\nsee docs/guides/ui.md.\n\nFlags:\n")
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
	if err := serve(ctx, *kubeconfig, *listen, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "kairon-ui:", err)
		return 1
	}
	return 0
}

func serve(ctx context.Context, kubeconfig, listen string, stdout, stderr io.Writer) error {
	cfg, err := restConfig(kubeconfig)
	if err != nil {
		return err
	}
	srv, err := New(cfg, Options{})
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
	if host, _, _ := net.SplitHostPort(listen); !isLoopback(host) {
		fmt.Fprintf(stderr, "kairon-ui: warning: listening on %s, not loopback: anyone who reaches it reads what this identity may read (per-user auth is not built yet)\n", listen)
	}
	fmt.Fprintf(stdout, "kairon-ui: serving http://%s (API server %s)\n", ln.Addr(), cfg.Host)
	hs := &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		// No write timeout: /api/v1/events streams while a page is open.
		// Requests get ctx, so the streams end when the server stops.
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
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
