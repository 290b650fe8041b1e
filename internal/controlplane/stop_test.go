package controlplane

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A child that ignores SIGTERM past its grace is killed; the stop fails
// only if that child keeps state (etcd), not for the API server or the
// controller manager, which keep theirs in etcd.
func TestStopFailsOnlyWhenEtcdHadToBeKilled(t *testing.T) {
	for _, tc := range []struct {
		stubborn string
		wantErr  bool
	}{
		{KubeAPIServer, false},
		{KubeControllerManager, false},
		{Etcd, true},
	} {
		t.Run(tc.stubborn, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.Mkdir(filepath.Join(dir, "logs"), 0o755); err != nil {
				t.Fatal(err)
			}
			cp := &ControlPlane{
				opts:    Options{StopTimeout: 300 * time.Millisecond},
				dataDir: dir,
				spawner: newSpawner(),
				log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
			}
			// The stubborn child says when it ignores SIGTERM, with a line
			// on a FIFO: a Stop sent before the shell ran its trap would
			// find it obliging. The test waits on that line, not on a clock.
			trapped := filepath.Join(dir, "trapped")
			if err := syscall.Mkfifo(trapped, 0o600); err != nil {
				t.Fatal(err)
			}
			// Read-write, so that opening does not wait for the writer; a
			// FIFO goes through the runtime's poller, so its read can time out.
			fifo, err := os.OpenFile(trapped, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer fifo.Close()
			for _, name := range []string{Etcd, KubeAPIServer, KubeControllerManager} {
				script := "exec sleep 60"
				if name == tc.stubborn {
					script = "trap '' TERM; echo > '" + trapped + "'; sleep 60"
				}
				c, err := startChild(cp.spawner, filepath.Join(dir, "logs"), name, "/bin/sh", []string{"-c", script}, func(*child) {})
				if err != nil {
					t.Fatal(err)
				}
				cp.children = append(cp.children, c)
			}
			// A minute is an upper bound for a loaded machine: the read
			// returns as soon as the line is written.
			if err := fifo.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
				t.Fatal(err)
			}
			if _, err := fifo.Read(make([]byte, 1)); err != nil {
				_ = cp.Stop()
				t.Fatalf("%s never set its trap: %v", tc.stubborn, err)
			}
			err = cp.Stop()
			switch {
			case tc.wantErr && (err == nil || !strings.Contains(err.Error(), tc.stubborn+" did not stop")):
				t.Errorf("Stop with %s ignoring SIGTERM: %v, want an error naming it", tc.stubborn, err)
			case !tc.wantErr && err != nil:
				t.Errorf("Stop with %s ignoring SIGTERM: %v, want no error (it keeps no state)", tc.stubborn, err)
			}
			for _, c := range cp.children {
				if !c.hasExited() {
					t.Errorf("%s still runs after Stop", c.name)
				}
			}
		})
	}
}
