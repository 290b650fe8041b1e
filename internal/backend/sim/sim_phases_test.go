package sim

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/backend"
)

func TestSimPhases(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	b, err := New(Options{StateDir: dir, BootDelay: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if b.Name() != "sim" || b.Acceleration() != "sim" {
		t.Fatalf("Name %q Acceleration %q", b.Name(), b.Acceleration())
	}
	spec := backend.Spec{ID: "ns_vm", Name: "ns/vm", CPU: 1, MemoryMiB: 128}
	in, err := b.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if in.Phase != backend.Booting || in.PID != 0 || in.ReadyAfter != 0 || in.Name != "ns/vm" {
		t.Fatalf("Start: %+v", in)
	}
	if again, _ := b.Start(ctx, spec); !again.StartedAt.Equal(in.StartedAt) {
		t.Errorf("Start of a known ID started anew: %+v", again)
	}
	if _, err := os.Stat(b.ConsoleLog("ns_vm")); err != nil {
		t.Errorf("console log: %v", err)
	}
	waitRunning(t, b, "ns_vm")
	if in, _ = b.Get(ctx, "ns_vm"); in.ReadyAfter != 100*time.Millisecond {
		t.Fatalf("after BootDelay: %+v, want ReadyAfter the BootDelay", in)
	}
	b.Get(ctx, "ns_vm")
	if console, _ := os.ReadFile(b.ConsoleLog("ns_vm")); !strings.HasSuffix(string(console), "\nKAIRON-READY\n") || strings.Count(string(console), "KAIRON-READY") != 1 {
		t.Errorf("console once Running: %q, want the ready marker once, last", console)
	}

	// A restart of the agent: same instances, same phases.
	b2, _ := New(Options{StateDir: dir})
	if _, err := b2.Start(ctx, backend.Spec{ID: "ns_other"}); err != nil {
		t.Fatal(err)
	}
	list, _ := b2.List(ctx)
	if len(list) != 2 || list[0].ID != "ns_other" || list[0].Phase != backend.Running || list[1].Phase != backend.Running {
		t.Fatalf("List: %+v", list)
	}

	if err := b2.Crash("ns_other", "simulated crash"); err != nil {
		t.Fatal(err)
	}
	if in, _ := b.Get(ctx, "ns_other"); in.Phase != backend.Exited || in.Reason != "simulated crash" || in.ConsoleTail == "" {
		t.Errorf("after Crash: %+v", in)
	}
	if again, _ := b.Start(ctx, backend.Spec{ID: "ns_other"}); again.Phase == backend.Exited {
		t.Errorf("Start over an exited instance: %+v", again)
	}

	// Save of a Booting instance restores Booting; of a Running one, Running.
	slow, _ := New(Options{StateDir: dir, BootDelay: time.Hour})
	if _, err := slow.Start(ctx, backend.Spec{ID: "ns_slow"}); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "slow.state")
	if err := slow.Save(ctx, "ns_slow", p); err != nil {
		t.Fatal(err)
	}
	if in, _ := slow.Get(ctx, "ns_slow"); in.Phase != backend.Paused {
		t.Errorf("after Save: %+v", in)
	}
	slow.Stop(ctx, "ns_slow")
	if left, _ := filepath.Glob(filepath.Join(dir, "ns_slow*")); len(left) != 0 {
		t.Errorf("Stop left %v", left)
	}
	if in, _ := slow.Restore(ctx, backend.Spec{ID: "ns_slow"}, p); in.Phase != backend.Booting {
		t.Errorf("restore of a booting instance: %+v", in)
	}
	os.WriteFile(p, []byte("{}"), 0o600)
	if _, err := slow.Restore(ctx, backend.Spec{ID: "ns_x"}, p); err == nil {
		t.Error("restore of a foreign file succeeded")
	}
	if _, err := b.Get(ctx, "../etc"); err == nil {
		t.Error("Get of an unsafe ID succeeded")
	}
}
