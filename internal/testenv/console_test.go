package testenv

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// fatalRecorder is a testing.TB whose Fatalf records the failure instead of
// ending the test; everything else is the real test's.
type fatalRecorder struct {
	testing.TB
	failed string
}

func (r *fatalRecorder) Helper() {}
func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
}

// TestConsoleExpectFailureShowsTheLogsTails: a console that answers nothing
// fails Expect with the end of each log WithLogs named (only the end of a
// long one), and says so of a log that is missing.
func TestConsoleExpectFailureShowsTheLogsTails(t *testing.T) {
	dir := t.TempDir()
	ln, err := net.Listen("unix", filepath.Join(dir, "console.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		// A guest that reads what is typed and prints nothing.
		c, err := ln.Accept()
		if err == nil {
			_, _ = c.Read(make([]byte, 4096))
		}
		accepted <- c
	}()
	defer func() {
		if c := <-accepted; c != nil {
			c.Close()
		}
	}()
	consoleLog := filepath.Join(dir, "console.log")
	head := strings.Repeat("early boot line\n", 1000)
	if err := os.WriteFile(consoleLog, []byte(head+"kernel BUG at lib/list_debug.c:30!\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "qemu.log")

	con := DialConsole(t, filepath.Join(dir, "console.sock")).WithLogs(consoleLog, missing)
	rec := &fatalRecorder{TB: t}
	con.Expect(rec, "echo x:$((1+1)).", regexp.MustCompile(`x:2\.`), 100*time.Millisecond)
	for _, want := range []string{"printed no", "--- end of " + consoleLog, "kernel BUG at lib/list_debug.c:30!", "--- end of " + missing, "no such file"} {
		if !strings.Contains(rec.failed, want) {
			t.Errorf("failure message lacks %q:\n%s", want, rec.failed)
		}
	}
	if len(rec.failed) > 2*logTailBytes {
		t.Errorf("failure message of %d bytes: want only the end of the %d-byte log", len(rec.failed), len(head))
	}
}
