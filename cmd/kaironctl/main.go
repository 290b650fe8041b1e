package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/zyvor/kairon/internal/kaironctl"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := kaironctl.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
