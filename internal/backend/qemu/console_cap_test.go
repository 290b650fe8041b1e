package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/testenv"
)

// setConsoleCap lowers the console log cap for one test.
func setConsoleCap(t *testing.T, limit int64) {
	old := consoleLogCap.Swap(limit)
	t.Cleanup(func() { consoleLogCap.Store(old) })
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// A log far past its cap is cut to the cap's last half, ends where it
// ended and says that it was cut.
func TestCapConsoleLog(t *testing.T) {
	const limit = 64 << 10
	path := filepath.Join(t.TempDir(), consoleLogFile)
	var b bytes.Buffer
	for i := 0; b.Len() < 1<<20; i++ {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if cut, err := capConsoleLog(path, limit); !cut || err != nil {
		t.Fatalf("capConsoleLog: cut %v, err %v", cut, err)
	}
	got, _ := os.ReadFile(path)
	if len(got) > limit || len(got) < limit/4 {
		t.Fatalf("log is %d bytes after the cut, want at most %d and not nearly empty", len(got), limit)
	}
	if !bytes.HasPrefix(got, []byte("[kairon: console log exceeded")) {
		t.Errorf("cut log begins %q", got[:60])
	}
	if !bytes.HasSuffix(got, b.Bytes()[b.Len()-200:]) {
		t.Errorf("cut log lost its end: %q", got[len(got)-60:])
	}
	// Each kept line is whole.
	for _, line := range strings.Split(strings.TrimSuffix(string(got), "\n"), "\n")[1:] {
		if !strings.HasPrefix(line, "line ") {
			t.Fatalf("cut log holds a partial line %q", line)
		}
	}
	// Under the cap: untouched.
	if cut, err := capConsoleLog(path, limit); cut || err != nil {
		t.Fatalf("second capConsoleLog: cut %v, err %v", cut, err)
	}
}

// A writer appending the way QEMU does (O_APPEND, without end) while the
// guard runs: the log never stays past its cap, and once the writer stops
// it is at most the cap.
func TestConsoleGuardCapsAnAppendingWriter(t *testing.T) {
	const limit = 64 << 10
	setConsoleCap(t, limit)
	dir := t.TempDir()
	if err := writeJSON(filepath.Join(dir, specFile), meta{StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, consoleLogFile)
	w, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	guardConsole(dir)
	guardConsole(dir) // a second call starts no second guard
	chunk := bytes.Repeat([]byte("y\n"), 2048)
	written := 0
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		n, err := w.Write(chunk)
		if err != nil {
			t.Fatal(err)
		}
		written += n
		if written%(256<<10) == 0 {
			// Real time: a guest prints at a finite rate, so the guard
			// runs between its bursts, as it would beside a real guest.
			time.Sleep(time.Millisecond)
		}
	}
	t.Logf("wrote %d bytes", written)
	if written < 16*limit {
		t.Fatalf("wrote only %d bytes", written)
	}
	testenv.Eventually(t, 5*time.Second, "the log to be back within its cap", func() (bool, string) {
		size := fileSize(t, path)
		return size <= limit, fmt.Sprintf("%d bytes", size)
	})
	// The guard ends with the VM (here: its spec.json).
	if err := os.Remove(filepath.Join(dir, specFile)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "the guard to end", func() (bool, string) {
		_, running := consoleGuards.Load(dir)
		return !running, ""
	})
}

// A real guest printing far more than the cap, before and after its
// Backend is replaced (an agent restart, the new Backend adopts the VM).
func TestConsoleLogCappedRealGuest(t *testing.T) {
	const limit = 64 << 10
	setConsoleCap(t, limit)
	b := newTestBackend(t, Options{Log: testLogger(t)})
	ctx := context.Background()
	spec := backend.Spec{ID: "ns1_flood", Name: "ns1/flood", CPU: 1, MemoryMiB: 128}
	if _, err := b.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, b, spec.ID, backend.Running, bootTimeout)
	path := b.ConsoleLog(spec.ID)

	flood := func(con *testenv.Console, tag string) {
		// 256 KiB of output (four times the cap), then a marker line once it is all printed.
		con.ExpectText(t, "yes flood-"+tag+" | head -c 262144; echo done-$((40+2))-"+tag, "done-42-"+tag, 3*time.Minute)
		testenv.Eventually(t, 5*time.Second, "the log to be within its cap", func() (bool, string) {
			size := fileSize(t, path)
			return size <= limit, fmt.Sprintf("%d bytes", size)
		})
		if got := readTail(path, 4096); !strings.Contains(got, "done-42-"+tag) {
			t.Errorf("the capped log lost its end: %q", got)
		}
	}
	// The console socket takes one client at a time: both floods use this one.
	con := testenv.DialConsole(t, b.ConsoleSocket(spec.ID))
	flood(con, "a")
	if inst, err := b.Get(ctx, spec.ID); err != nil || inst.Phase != backend.Running {
		t.Fatalf("after the flood: %+v, %v", inst, err)
	}

	// A new Backend over the same directory adopts the VM; its guard starts
	// at the first Get. (The first Backend's guard runs on too; two guards
	// cutting the same log are harmless.)
	b2, err := New(Options{StateDir: b.opts.StateDir, GuestDir: b.opts.GuestDir, Acceleration: b.accel})
	if err != nil {
		t.Fatal(err)
	}
	consoleGuards.Delete(b2.dir(spec.ID)) // as in a new process
	if inst, err := b2.Get(ctx, spec.ID); err != nil || inst.Phase != backend.Running {
		t.Fatalf("adopted: %+v, %v", inst, err)
	}
	flood(con, "b")
}

// While the guard cuts, a writer appending as QEMU does loses nothing: the
// log's lines stay consecutive, only its head is dropped (a ring). This
// needs a file system that collapses ranges (ext4, xfs), as the state dir
// is on.
func TestConsoleLogCutLosesNothingWhileAppending(t *testing.T) {
	const limit = 64 << 10
	path := filepath.Join(t.TempDir(), consoleLogFile)
	w, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := unix.Fallocate(int(w.Fd()), unix.FALLOC_FL_COLLAPSE_RANGE, 0, 0); errors.Is(err, unix.EOPNOTSUPP) {
		t.Skipf("the file system of %s cannot collapse ranges", path)
	}
	stop := make(chan struct{})
	done := make(chan int)
	go func() {
		i := 0
		for ; ; i++ {
			select {
			case <-stop:
				done <- i
				return
			default:
			}
			if _, err := fmt.Fprintf(w, "line %08d\n", i); err != nil {
				t.Error(err)
				done <- i
				return
			}
		}
	}()
	cuts := 0
	for cuts < 50 {
		cut, err := capConsoleLog(path, limit)
		if err != nil {
			t.Fatal(err)
		}
		if cut {
			cuts++
		}
	}
	close(stop)
	written := <-done
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(got), "\n"), "\n")
	if !strings.HasPrefix(lines[0], "[kairon: console log exceeded") {
		t.Errorf("cut log begins %q", lines[0])
	}
	var prev int
	for k, line := range lines[1:] {
		var n int
		if _, err := fmt.Sscanf(line, "line %08d", &n); err != nil {
			t.Fatalf("line %d after the note is %q, not a whole line", k+1, line)
		}
		if k > 0 && n != prev+1 {
			t.Fatalf("after %d cuts the log skips from line %d to %d: output was lost", cuts, prev, n)
		}
		prev = n
	}
	if prev != written-1 {
		t.Errorf("the log ends at line %d, the writer wrote up to %d", prev, written-1)
	}
}
