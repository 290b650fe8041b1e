package sim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/testenv"
)

// waitRunning waits until the instance is Running, its BootDelay over.
func waitRunning(t *testing.T, b *Backend, id string) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, id+" to be Running", func() (bool, string) {
		in, err := b.Get(context.Background(), id)
		return err == nil && in.Phase == backend.Running, fmt.Sprintf("%+v (err %v)", in, err)
	})
}

func TestSimLifecycleSurvivesANewBackend(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	b, err := New(Options{StateDir: dir, BootDelay: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	in, err := b.Start(ctx, backend.Spec{ID: "ns_a", Name: "ns/a"})
	if err != nil || in.Phase != backend.Booting || in.Acceleration != "sim" {
		t.Fatalf("Start = %+v, %v; want Booting", in, err)
	}
	waitRunning(t, b, "ns_a")
	if in, _ = b.Get(ctx, "ns_a"); in.ReadyAfter != 200*time.Millisecond {
		t.Fatalf("after the boot delay: %+v, want ReadyAfter the BootDelay", in)
	}

	// A new backend over the same directory adopts the instance unchanged.
	again, _ := New(Options{StateDir: dir, BootDelay: time.Hour})
	list, err := again.List(ctx)
	if err != nil || len(list) != 1 || list[0].Phase != backend.Running || !list[0].StartedAt.Equal(in.StartedAt) {
		t.Fatalf("re-adopted list = %+v, %v", list, err)
	}

	if err := again.Pause(ctx, "ns_a"); err != nil {
		t.Fatal(err)
	}
	if in, _ := again.Get(ctx, "ns_a"); in.Phase != backend.Paused {
		t.Errorf("after Pause: %s", in.Phase)
	}
	if err := again.Resume(ctx, "ns_a"); err != nil {
		t.Fatal(err)
	}

	saved := filepath.Join(t.TempDir(), "state")
	if err := again.Save(ctx, "ns_a", saved); err != nil {
		t.Fatal(err)
	}
	if err := again.Stop(ctx, "ns_a"); err != nil {
		t.Fatal(err)
	}
	if _, err := again.Get(ctx, "ns_a"); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("after Stop: %v", err)
	}
	if err := again.Stop(ctx, "ns_a"); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	restored, err := again.Restore(ctx, backend.Spec{ID: "ns_a", Name: "ns/a"}, saved)
	if err != nil || restored.Phase != backend.Running {
		t.Fatalf("Restore = %+v, %v; want Running at once", restored, err)
	}
	if _, err := again.Restore(ctx, backend.Spec{ID: "ns_b"}, filepath.Join(dir, "missing")); err == nil {
		t.Error("Restore from a missing file succeeded")
	}
}

// TestSimLiveMigration: the record travels over a connection; the sender
// ends paused and the receiver runs at once, as a migrated guest would.
func TestSimLiveMigration(t *testing.T) {
	ctx := context.Background()
	source, _ := New(Options{StateDir: t.TempDir(), BootDelay: 10 * time.Millisecond})
	target, _ := New(Options{StateDir: t.TempDir(), BootDelay: time.Hour})
	spec := backend.Spec{ID: "ns_live", Name: "ns/live", CPU: 2}
	if _, err := source.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	waitRunning(t, source, spec.ID)
	send, receive := net.Pipe()
	received := make(chan backend.Instance, 1)
	go func() {
		in, err := target.ReceiveLive(ctx, spec, receive)
		if err != nil {
			t.Error(err)
		}
		received <- in
	}()
	if _, err := source.SendLive(ctx, spec.ID, send, backend.LiveOptions{}); err != nil {
		t.Fatal(err)
	}
	if in := <-received; in.Phase != backend.Running {
		t.Errorf("received instance %+v, want Running without booting again", in)
	}
	if in, _ := source.Get(ctx, spec.ID); in.Phase != backend.Paused {
		t.Errorf("sender after SendLive: %s, want Paused", in.Phase)
	}

	// A broken stream starts nothing.
	send, receive = net.Pipe()
	go func() { _, _ = send.Write([]byte("not a record\n")); send.Close() }()
	if _, err := target.ReceiveLive(ctx, backend.Spec{ID: "ns_bad"}, receive); err == nil {
		t.Error("ReceiveLive accepted a stream that is not a sim record")
	}
	if _, err := target.Get(ctx, "ns_bad"); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("after a broken stream: %v, want no instance", err)
	}
}

// As with QEMU, an instance that booted a root image is restored only
// with one, and one without only without.
func TestSimRestoreKeepsTheRootImage(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	b, err := New(Options{StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ id, saved, restored string }{{"ns_img", "/images/a.sqfs", ""}, {"ns_plain", "", "/images/a.sqfs"}} {
		if _, err := b.Start(ctx, backend.Spec{ID: tc.id, RootImage: tc.saved}); err != nil {
			t.Fatal(err)
		}
		waitRunning(t, b, tc.id)
		state := filepath.Join(dir, tc.id+".state")
		if err := b.Save(ctx, tc.id, state); err != nil {
			t.Fatal(err)
		}
		if err := b.Stop(ctx, tc.id); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Restore(ctx, backend.Spec{ID: tc.id, RootImage: tc.restored}, state); err == nil {
			t.Errorf("%s saved with root image %q restored with %q", tc.id, tc.saved, tc.restored)
		}
		if in, err := b.Restore(ctx, backend.Spec{ID: tc.id, RootImage: tc.saved}, state); err != nil || in.Phase != backend.Running {
			t.Errorf("%s restored with its own root image: %+v %v", tc.id, in, err)
		}
	}
}
