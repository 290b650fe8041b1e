package node

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/zyvor/kairon/internal/backend"
)

// consoleFiles is a backend whose only part the server uses is ConsoleLog.
type consoleFiles struct {
	backend.Backend
	dir string
}

func (c consoleFiles) ConsoleLog(id string) string { return filepath.Join(c.dir, id, "console.log") }

// serverUnderAttack is an agent's HTTP handler over a state directory that
// holds one good saved state and console, and secrets around them that a
// path leading out of the right directory would reach.
func serverUnderAttack(t *testing.T) (http.Handler, string) {
	root := t.TempDir()
	state := filepath.Join(root, "state")
	for _, p := range []string{
		"state/migrations/ns_ok.state",
		"state/vms/ns_vm/console.log",
		"secret.state", "state/secret.state", "state/migrations/secret.state",
		"console.log", "state/console.log", "state/vms/console.log", "state/vms/secret/console.log",
	} {
		content := "SECRET " + p + "\n"
		if strings.Contains(p, "_ok") || strings.Contains(p, "ns_vm") {
			content = "GOOD\n"
		}
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	a := &Agent{opts: Options{StateDir: state, NodeName: "n1", Backend: consoleFiles{dir: filepath.Join(state, "vms")}},
		consoleAuth: newConsoleAuth(nsReader{})}
	return a.handler(), root
}

// nsReader lets token "reader" (user reader) read consoles of namespace ns
// only, as RBAC would.
type nsReader struct{}

func (nsReader) reviewToken(_ context.Context, token string) (consoleUser, bool, error) {
	return consoleUser{name: token}, token == "reader", nil
}

func (nsReader) mayAccess(_ context.Context, user consoleUser, access machineAccess, namespace, _ string) (bool, error) {
	return user.name == "reader" && namespace == "ns" && access == readConsole, nil
}

func (nsReader) mayImpersonate(context.Context, consoleUser, impersonationTarget) (bool, error) {
	return false, nil
}

// rawRequest is a request exactly as written on the wire.
func rawRequest(t *testing.T, target string) *http.Request {
	t.Helper()
	req, err := http.ReadRequest(bufio.NewReader(strings.NewReader("GET " + target + " HTTP/1.1\r\nHost: n1\r\nAuthorization: Bearer reader\r\n\r\n")))
	if err != nil {
		t.Fatalf("%s: %v", target, err)
	}
	return req
}

// do sends a request exactly as written on the wire.
func do(t *testing.T, h http.Handler, target string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, rawRequest(t, target))
	return rec
}

func TestServerRefusesPathTraversal(t *testing.T) {
	h, _ := serverUnderAttack(t)
	for _, target := range []string{
		"/v1/machines/ns/..%2F..%2Fvm/console?tail=1",
		"/v1/machines/ns/..%2fvm/console",
		"/v1/machines/ns/%2E%2E%2F%2E%2E%2Fsecret/console",
		"/v1/machines/ns/a%2Fb/console",
		"/v1/machines/ns/..%5Csecret/console",
		"/v1/machines/ns/vm%00/console",
		"/v1/machines/NS/vm/console",
		"/v1/machines/ns/x..y/console",
		"/v1/machines/ns/.vm/console",
		"/v1/machines/" + strings.Repeat("a", 64) + "/vm/console",
		"/v1/machines/..%2Fsecret/x/console",
		"/v1/machines/ns/%2e%2e/console",
		"/v1/machines/%2e%2e/%2e%2e/console",
		"/v1/machines/ns/..%2F..%2Fsecret/console",
	} {
		rec := do(t, h, target)
		if rec.Code != http.StatusBadRequest || strings.Contains(rec.Body.String(), "SECRET") || len(rec.Body.String()) > 64 {
			t.Errorf("%s: %d %q, want 400 and a terse message", target, rec.Code, rec.Body.String())
		}
	}
	// Unencoded dot segments never reach a handler (the mux redirects to
	// the cleaned path); nothing is read either way.
	for _, target := range []string{
		"/v1/migrations/ns/../../secret/state",
		"/v1/machines/ns/../../secret/console",
	} {
		if rec := do(t, h, target); rec.Code == http.StatusOK || strings.Contains(rec.Body.String(), "SECRET") {
			t.Errorf("%s: %d %q", target, rec.Code, rec.Body.String())
		}
	}
	// Saved states are not served on this port at all any more, however
	// the path is spelt (they go over the migration listener).
	for _, target := range []string{
		"/v1/migrations/ns/ok/state",
		"/v1/migrations/ns/..%2F..%2Fsecret/state",
		"/v1/migrations/ns/%2e%2e/state",
	} {
		if rec := do(t, h, target); rec.Code != http.StatusNotFound || strings.Contains(rec.Body.String(), "SECRET") || strings.Contains(rec.Body.String(), "GOOD") {
			t.Errorf("%s: %d %q, want 404", target, rec.Code, rec.Body.String())
		}
	}
	// The good one still works.
	if rec := do(t, h, "/v1/machines/ns/vm/console?tail=5"); rec.Code != http.StatusOK || rec.Body.String() != "GOOD\n" {
		t.Errorf("console: %d %q, want 200 GOOD", rec.Code, rec.Body.String())
	}
}

// qemuStateHeader is a header like internal/backend/qemu's saveHeader.
func qemuStateHeader(memMiB int64) []byte {
	h := make([]byte, stateHeaderSize)
	copy(h, fmt.Sprintf(`{"format":%q,"id":"ns_vm","memoryMiB":%d}`+"\n", stateFormatQEMU, memMiB))
	return h
}

func TestServerWillNotSendAStateOverItsDeclaredSize(t *testing.T) {
	_, root := serverUnderAttack(t)
	a := &Agent{opts: Options{StateDir: filepath.Join(root, "state"), NodeName: "n1"}}
	path := filepath.Join(root, "state/migrations/ns_big.state")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(qemuStateHeader(1)); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(stateLimit(1) + 1); err != nil { // sparse
		t.Fatal(err)
	}
	f.Close()
	if file, size, err := a.openSavedState("ns", "big"); err == nil {
		file.Close()
		t.Errorf("a state past its declared size: opened, %d bytes", size)
	}
	if err := os.Truncate(path, stateLimit(1)); err != nil {
		t.Fatal(err)
	}
	file, size, err := a.openSavedState("ns", "big")
	if err != nil || size != stateLimit(1) {
		t.Fatalf("a state at its declared size: %v, %d bytes, want %d", err, size, stateLimit(1))
	}
	file.Close()
}

// endless is a source that never stops sending.
type endless struct{ sent int64 }

func (e *endless) Read(p []byte) (int, error) {
	e.sent += int64(len(p))
	return len(p), nil
}

func TestStateDownloadNeverExceedsItsLimit(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m", "ns_mig.incoming")
	check := func(what string, err error, wantErr bool) {
		t.Helper()
		if wantErr != (err != nil) {
			t.Fatalf("%s: err %v", what, err)
		}
		if fi, err := os.Stat(path + ".tmp"); err == nil {
			t.Errorf("%s: left %s (%d bytes)", what, path+".tmp", fi.Size())
		}
	}
	const limit = 1 << 20

	// An endless stream: stopped one byte past the limit, nothing kept.
	src := &endless{}
	err := saveStateDownload(path, src, -1, limit, "n1")
	check("endless", err, true)
	if !errors.Is(err, errStateTooLarge(limit)) && !strings.Contains(err.Error(), "exceeds") {
		t.Errorf("endless: %v", err)
	}
	if _, err := os.Stat(path); err == nil {
		t.Errorf("endless: %s exists", path)
	}
	if src.sent > limit+2*stateHeaderSize+32<<10 {
		t.Errorf("read %d bytes of an endless stream with a limit of %d", src.sent, limit)
	}

	// An announced length over the limit: refused before reading.
	src = &endless{}
	check("announced", saveStateDownload(path, src, limit+1, limit, "n1"), true)
	if src.sent != 0 {
		t.Errorf("announced: read %d bytes", src.sent)
	}

	// A header declaring less memory than the Machine has narrows the limit.
	declared := stateLimit(1)
	src = &endless{}
	check("declared", saveStateDownload(path, io.MultiReader(bytes.NewReader(qemuStateHeader(1)), src), -1, stateLimit(1024), "n1"), true)
	if got := src.sent + stateHeaderSize; got > declared+64<<10 {
		t.Errorf("declared: read %d bytes, declared limit %d", got, declared)
	}

	// Shorter than announced: not kept.
	check("short", saveStateDownload(path, strings.NewReader("abc"), 10, limit, "n1"), true)

	// A state within its limit arrives whole.
	want := append(qemuStateHeader(1), bytes.Repeat([]byte{7}, 5000)...)
	check("good", saveStateDownload(path, bytes.NewReader(want), int64(len(want)), limit, "n1"), false)
	if got, _ := os.ReadFile(path); !bytes.Equal(got, want) {
		t.Errorf("good: %d bytes saved, want %d", len(got), len(want))
	}
}

func TestConsoleTailIsBounded(t *testing.T) {
	h, root := serverUnderAttack(t)
	var b bytes.Buffer
	for i := 0; i < 200000; i++ {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	if err := os.WriteFile(filepath.Join(root, "state/vms/ns_vm/console.log"), b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tail := range []string{"1000000000", "99999999999999999999999", "10000"} {
		rec := do(t, h, "/v1/machines/ns/vm/console?tail="+tail)
		lines := strings.Split(strings.TrimSuffix(rec.Body.String(), "\n"), "\n")
		if rec.Code != http.StatusOK || len(lines) != maxTailLines || lines[len(lines)-1] != "line 199999" || lines[0] != "line 190000" {
			t.Errorf("tail=%s: %d, %d lines, want the last %d", tail, rec.Code, len(lines), maxTailLines)
		}
	}
	for _, tail := range []string{"-1", "x", "+5", "1e9"} {
		if rec := do(t, h, "/v1/machines/ns/vm/console?tail="+tail); rec.Code != http.StatusBadRequest {
			t.Errorf("tail=%s: %d, want 400", tail, rec.Code)
		}
	}
}

// lastLinesNaive is what seekToLastLines must agree with.
func lastLinesNaive(s string, n int) string {
	if n <= 0 {
		return ""
	}
	lines := strings.SplitAfter(s, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "")
}

func TestSeekToLastLines(t *testing.T) {
	long := strings.Repeat("x", 200<<10)
	for _, content := range []string{
		"", "\n", "\n\n\n", "a", "a\n", "a\nb", "a\nb\n", "a\n\nb\n\n",
		long, long + "\n" + long, "1\n" + long + "\n2\n", strings.Repeat("ab\n", 70000),
	} {
		for _, n := range []int{0, 1, 2, 3, 5, 70001} {
			f, err := os.CreateTemp(t.TempDir(), "log")
			if err != nil {
				t.Fatal(err)
			}
			_, _ = f.WriteString(content)
			if err := seekToLastLines(f, n); err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(f)
			f.Close()
			if want := lastLinesNaive(content, n); string(got) != want {
				t.Errorf("%d lines of %.20q (%d bytes): got %d bytes, want %d", n, content, len(content), len(got), len(want))
			}
		}
	}
}

func TestSanitizeGuestText(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"plain text\n\tindented", "plain text\n\tindented"},
		{"bell\a nul\x00 cr\r bs\b esc\x1b[31mred\x1b[0m del\x7f", "bell nul cr bs esc[31mred[0m del"},
		{"c1 \u0085 \u009b31m \u0080\u009f end", "c1  31m  end"},
		{"ünïcödé ✓ 日本", "ünïcödé ✓ 日本"},
		{"bad \xff\xfe utf8", "bad ? utf8"},
		{"\x1b]0;title\x07prompt$ ", "]0;titleprompt$ "},
	} {
		if got := sanitizeGuestText(tc.in); got != tc.want {
			t.Errorf("sanitizeGuestText(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	// Capped at maxGuestText, keeping the end, on a rune boundary.
	long := strings.Repeat("é", maxGuestText) + "THE END"
	got := sanitizeGuestText(long)
	if len(got) > maxGuestText || !strings.HasSuffix(got, "THE END") || !utf8.ValidString(got) {
		t.Errorf("long text: %d bytes, valid %v, ends %q", len(got), utf8.ValidString(got), got[len(got)-10:])
	}
	flood := strings.Repeat("\x1b", 1<<20) + "x"
	if got := sanitizeGuestText(flood); got != "x" {
		t.Errorf("a megabyte of escapes: %q", got)
	}
}

// checkSanitized is what sanitizeGuestText promises for any input.
func checkSanitized(t *testing.T, in, out string) {
	if len(out) > maxGuestText {
		t.Fatalf("%d bytes out", len(out))
	}
	if !utf8.ValidString(out) {
		t.Fatalf("invalid UTF-8 out: %q", out)
	}
	for _, r := range out {
		if (r < 0x20 && r != '\n' && r != '\t') || r == 0x7f || (r >= 0x80 && r <= 0x9f) {
			t.Fatalf("control character %U in %q (from %q)", r, out, in)
		}
	}
	if again := sanitizeGuestText(out); again != out {
		t.Fatalf("not idempotent: %q then %q", out, again)
	}
}

func FuzzSanitizeGuestText(f *testing.F) {
	for _, seed := range []string{
		"", "hello\n", "\x1b[2J\x1b[H", "\r\n\x00\x07", "\u0085\u009b", "\xff\xfe\xc3", "é\xc3",
		strings.Repeat("a", maxGuestText+1), strings.Repeat("日", maxGuestText), "Kernel panic - not syncing\n",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in string) {
		checkSanitized(t, in, sanitizeGuestText(in))
	})
}
