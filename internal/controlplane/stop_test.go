package controlplane

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
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
			// The stubborn child says when it ignores SIGTERM: a Stop sent
			// before the shell ran its trap would find it obliging.
			trapped := filepath.Join(dir, "trapped")
			for _, name := range []string{Etcd, KubeAPIServer, KubeControllerManager} {
				script := "exec sleep 60"
				if name == tc.stubborn {
					script = "trap '' TERM; : > '" + trapped + "'; sleep 60"
				}
				c, err := startChild(cp.spawner, filepath.Join(dir, "logs"), name, "/bin/sh", []string{"-c", script}, func(*child) {})
				if err != nil {
					t.Fatal(err)
				}
				cp.children = append(cp.children, c)
			}
			for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
				if _, err := os.Stat(trapped); err == nil {
					break
				}
				if time.Now().After(deadline) {
					_ = cp.Stop()
					t.Fatalf("%s never set its trap", tc.stubborn)
				}
			}
			err := cp.Stop()
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
