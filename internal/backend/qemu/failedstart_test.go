package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/testenv"
)

// TestFailedStartLeavesNothingBehind fails starts after QEMU was launched:
// a boot at the last moment (startFailpoint), a restore whose stream QEMU
// refuses at once, and a live receive cancelled while QEMU waits for the
// stream. None may leave a QEMU process, the VM's state directory or a
// descriptor of ours behind.
func TestFailedStartLeavesNothingBehind(t *testing.T) {
	b := newTestBackend(t, Options{Log: testLogger(t)})
	ctx := context.Background()
	spec := backend.Spec{ID: "ns1_doomed", Name: "ns1/doomed", CPU: 1, MemoryMiB: 128}

	t.Run("boot", func(t *testing.T) {
		before := openFDs(t)
		injected := errors.New("injected failure")
		pid := 0
		var jail jailRecord
		startFailpoint = func(id string) error {
			pid = readPIDFile(filepath.Join(b.dir(id), pidFile))
			_ = readJSON(filepath.Join(b.dir(id), jailFile), &jail)
			return injected
		}
		t.Cleanup(func() { startFailpoint = nil })
		if _, err := b.Start(ctx, spec); !errors.Is(err, injected) {
			t.Fatalf("Start: %v, want the injected failure", err)
		}
		if pid <= 0 {
			t.Fatal("the failpoint found no QEMU pidfile: the start failed before launching")
		}
		if len(jail.Cgroups) == 0 {
			t.Fatal("the failpoint found no jail")
		}
		assertNothingLeft(t, b, spec.ID, pid, before)
		for _, cg := range jail.Cgroups {
			if _, err := os.Stat(cg); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("cgroup %s left by the failed start: %v", cg, err)
			}
		}
	})

	t.Run("restore", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "garbage.state")
		f, err := createSaved(path, saveHeader{Format: saveFormat, ID: spec.ID, CPU: spec.CPU, MemoryMiB: spec.MemoryMiB})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString("no QEMU migration stream\n"); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		before := openFDs(t)
		_, err = b.Restore(ctx, spec, path)
		if err == nil {
			t.Fatal("Restore of a stream QEMU cannot load succeeded")
		}
		t.Logf("Restore: %v", err)
		assertNothingLeft(t, b, spec.ID, 0, before)
		if _, err := os.Stat(path); err != nil {
			t.Errorf("the state file restored from: %v, want it left alone", err)
		}
	})

	t.Run("receive", func(t *testing.T) {
		hdr, err := encodeHeader(saveHeader{Format: saveFormat, ID: spec.ID, CPU: spec.CPU, MemoryMiB: spec.MemoryMiB})
		if err != nil {
			t.Fatal(err)
		}
		stream := &stalledStream{header: hdr, release: make(chan struct{})}
		t.Cleanup(func() { close(stream.release) })
		before := openFDs(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		received := make(chan error, 1)
		go func() {
			_, err := b.ReceiveLive(ctx, spec, stream)
			received <- err
		}()
		var pids []int
		testenv.Eventually(t, 30*time.Second, "QEMU to wait for the incoming stream", func() (bool, string) {
			select {
			case err := <-received:
				t.Fatalf("ReceiveLive returned before it was cancelled: %v", err)
			default:
			}
			if pids = qemuProcesses(b.opts.StateDir); len(pids) == 0 {
				return false, "no QEMU yet"
			}
			var st qmpStatus
			err := qmpDo(context.Background(), b.QMPSocket(spec.ID), func(q *qmpConn) error { var err error; st, err = q.status(); return err })
			return err == nil && st.Status == "inmigrate", fmt.Sprintf("QMP status %q, err %v", st.Status, err)
		})
		// QEMU parses the incoming stream, which a hostile sender writes,
		// only once jailed.
		if root, err := os.Readlink(fmt.Sprintf("/proc/%d/root", pids[0])); err != nil || root != filepath.Join(b.dir(spec.ID), jailRootDir) {
			t.Errorf("qemu waiting for the stream has root %q (%v), want its jail", root, err)
		}
		if st := procStatus(t, pids[0]); st["Seccomp"] != "2" {
			t.Errorf("qemu waiting for the stream: Seccomp %q, want 2", st["Seccomp"])
		}
		cancel()
		if err := <-received; err == nil {
			t.Fatal("a cancelled ReceiveLive succeeded")
		} else {
			t.Logf("ReceiveLive: %v", err)
		}
		assertNothingLeft(t, b, spec.ID, pids[0], before)
	})
}

// stalledStream is a live migration stream that stops after its header,
// until release is closed.
type stalledStream struct {
	header  []byte
	release chan struct{}
}

func (s *stalledStream) Read(p []byte) (int, error) {
	if len(s.header) > 0 {
		n := copy(p, s.header)
		s.header = s.header[n:]
		return n, nil
	}
	<-s.release
	return 0, io.EOF
}

// assertNothingLeft checks that a failed start of id left no trace: pid (if
// known) reaped, no QEMU under the state directory, no state directory, no
// instance, and the same descriptors open as before.
func assertNothingLeft(t *testing.T, b *Backend, id string, pid int, fdsBefore []string) {
	t.Helper()
	if pid > 0 {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("qemu %d still exists after the failed start (kill 0: %v)", pid, err)
		}
	}
	if left := qemuProcesses(b.opts.StateDir); len(left) != 0 {
		t.Errorf("qemu processes left: %v", left)
	}
	if _, err := os.Stat(b.dir(id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state directory left: %v", err)
	}
	if _, err := b.Get(context.Background(), id); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("Get after the failed start: %v, want ErrNotFound", err)
	}
	if b.jail != nil {
		claims, _ := os.ReadDir(b.jail.registry)
		for _, c := range claims {
			if owner, _ := os.ReadFile(filepath.Join(b.jail.registry, c.Name())); string(owner) == b.dir(id) {
				t.Errorf("uid %s still claimed by the failed start", c.Name())
			}
		}
	}
	if after := openFDs(t); !slices.Equal(after, fdsBefore) {
		t.Errorf("open descriptors changed:\nbefore %q\nafter  %q", fdsBefore, after)
	}
}

// openFDs lists what this process's descriptors refer to, sorted, leaving
// out the Go runtime's own (epoll and its wakeup, made on first use).
func openFDs(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil || strings.HasPrefix(target, "anon_inode:") {
			continue // err: the descriptor ReadDir read the directory with
		}
		out = append(out, fmt.Sprintf("%s -> %s", e.Name(), target))
	}
	slices.Sort(out)
	return out
}
