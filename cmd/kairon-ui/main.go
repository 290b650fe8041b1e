// Command kairon-ui serves Kairon's read-only web dashboard and JSON API
// (/api/v1/...) from an informer cache of the cluster a kubeconfig names.
//
//	kairon-ui --kubeconfig .kairon/kubeconfig            # http://127.0.0.1:8090
//
// See docs/guides/ui.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/zyvor/kairon/internal/ui"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kairon-ui:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("kairon-ui", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the cluster to show (default: $KUBECONFIG, ~/.kube/config, then the in-cluster config)")
	listen := fs.String("listen", "127.0.0.1:8090", "address to serve the dashboard and the API on; the UI has no login yet, so keep it on loopback")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	cfg, err := restConfig(*kubeconfig)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	srv, err := ui.New(cfg, ui.Options{})
	if err != nil {
		return err
	}
	if err := srv.Start(ctx); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	if host, _, _ := net.SplitHostPort(*listen); !isLoopback(host) {
		fmt.Fprintf(os.Stderr, "kairon-ui: warning: listening on %s, not loopback: anyone who reaches it reads what this identity may read (per-user auth is not built yet)\n", *listen)
	}
	fmt.Printf("kairon-ui: serving http://%s (API server %s)\n", ln.Addr(), cfg.Host)
	// No write timeout: /api/v1/events streams for as long as a page is open.
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Event streams never end by themselves: close what is left after 5 s.
	if err := hs.Shutdown(shutdown); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
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

// restConfig loads --kubeconfig, or kubectl's defaults, or the in-cluster
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
