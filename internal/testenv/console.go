package testenv

import (
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// Console is a test's client of a VM's serial console socket, where
// Kairon's default guest keeps a shell. Tests type into it to put state into
// the guest's memory and read it back.
type Console struct {
	conn net.Conn
	mu   sync.Mutex
	seen strings.Builder
	logs []string // files whose tails a failed Expect shows
}

// WithLogs names files a failed Expect shows the end of: the console's log
// (QEMU's chardev logfile), which has all the guest printed, connected
// client or not, tells a guest that printed nothing from output that never
// reached this client; QEMU's own log tells why it stopped.
func (c *Console) WithLogs(paths ...string) *Console {
	c.logs = append(c.logs, paths...)
	return c
}

// logTailBytes is how much of each of a Console's logs a failure shows.
const logTailBytes = 3000

// logTails is the end of each of c's logs, for a failure message.
func (c *Console) logTails() string {
	var sb strings.Builder
	for _, path := range c.logs {
		fmt.Fprintf(&sb, "\n--- end of %s:\n%s", path, fileTail(path, logTailBytes))
	}
	return sb.String()
}

// fileTail is the last n bytes of the file at path, or why there are none.
func fileTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		_, _ = f.Seek(st.Size()-n, io.SeekStart)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return err.Error()
	}
	if len(b) == 0 {
		return "(empty)"
	}
	return string(b)
}

// DialConsole connects to the console socket at path. The connection is
// closed when the test ends.
func DialConsole(tb testing.TB, path string) *Console {
	tb.Helper()
	conn, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		tb.Fatalf("console %s: %v", path, err)
	}
	c := &Console{conn: conn}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			c.mu.Lock()
			c.seen.Write(buf[:n])
			c.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	tb.Cleanup(func() { conn.Close(); <-done })
	return c
}

// Expect types line into the console and waits, up to timeout, until what
// the console printed after it matches want. It returns the match and its
// submatches. The guest echoes the line itself, so want should match only
// the command's output (print "x:$((1+1))." and expect "x:2\.").
func (c *Console) Expect(tb testing.TB, line string, want *regexp.Regexp, timeout time.Duration) []string {
	tb.Helper()
	c.mu.Lock()
	from := c.seen.Len()
	c.mu.Unlock()
	if _, err := c.conn.Write([]byte(line + "\n")); err != nil {
		tb.Fatalf("console: %v", err)
	}
	var out string
	for deadline := time.Now().Add(timeout); ; time.Sleep(20 * time.Millisecond) {
		c.mu.Lock()
		out = c.seen.String()[from:]
		c.mu.Unlock()
		if m := want.FindStringSubmatch(out); m != nil {
			return m
		}
		if time.Now().After(deadline) {
			break
		}
	}
	tb.Fatalf("console: %q printed no %s within %s; printed %q%s", line, want, timeout, out, c.logTails())
	return nil
}

// ExpectText is Expect with a literal text to wait for.
func (c *Console) ExpectText(tb testing.TB, line, text string, timeout time.Duration) {
	tb.Helper()
	c.Expect(tb, line, regexp.MustCompile(regexp.QuoteMeta(text)), timeout)
}
