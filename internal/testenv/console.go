package testenv

import (
	"net"
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
	tb.Fatalf("console: %q printed no %s within %s; printed %q", line, want, timeout, out)
	return nil
}

// ExpectText is Expect with a literal text to wait for.
func (c *Console) ExpectText(tb testing.TB, line, text string, timeout time.Duration) {
	tb.Helper()
	c.Expect(tb, line, regexp.MustCompile(regexp.QuoteMeta(text)), timeout)
}
