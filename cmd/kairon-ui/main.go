// Command kairon-ui serves Kairon's read-only web dashboard and JSON API
// (/api/v1/...) from an informer cache of the cluster a kubeconfig names.
//
//	kairon-ui --kubeconfig .kairon/kubeconfig            # http://127.0.0.1:8090
//
// See docs/guides/ui.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/zyvor/kairon/internal/ui"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := ui.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
