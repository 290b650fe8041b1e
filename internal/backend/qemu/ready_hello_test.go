package qemu

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/guestagent/agent"
)

// A guest agent that accepts the readiness watcher's connection but never
// says Hello (seen under load early in a boot) does not hold the watcher:
// it dials again, and the agent that answers the next connection makes the
// guest ready.
func TestAwaitAgentReadyRedialsASilentAgent(t *testing.T) {
	dir := t.TempDir()
	b := &Backend{opts: Options{StateDir: dir}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	const id = "ns_vm"
	if err := os.MkdirAll(filepath.Join(dir, id), 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", b.AgentSocket(id))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ready := filepath.Join(dir, "ready")
	if err := os.WriteFile(ready, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	silent := make(chan net.Conn, 1)
	go func() {
		first, err := l.Accept()
		if err != nil {
			return
		}
		silent <- first // held open, never answered
		next, err := l.Accept()
		if err != nil {
			return
		}
		defer next.Close()
		_ = agent.New(agent.Options{Boot: "n0nce", ReadyFile: ready}).Serve(next)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 4*agentStatusTimeout)
	defer cancel()
	began := time.Now()
	if _, ok := b.awaitAgentReady(ctx, id, "n0nce"); !ok {
		t.Fatalf("not ready after %s", time.Since(began))
	}
	(<-silent).Close()
}
