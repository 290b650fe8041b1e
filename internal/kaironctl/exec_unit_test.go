package kaironctl

import (
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/zyvor/kairon/internal/guestagent/wire"
)

func TestRemoteSpec(t *testing.T) {
	for _, c := range []struct {
		arg, machine, path string
		ok                 bool
	}{
		{"vm:/tmp/x", "vm", "/tmp/x", true},
		{"mc/claim:/a:b", "mc/claim", "/a:b", true},
		{"machine/vm:/", "machine/vm", "/", true},
		{"vm:relative", "", "", false},
		{"./vm:/x", "", "", false},
		{"a/b/c:/x", "", "", false},
		{":/x", "", "", false},
		{"/local/file", "", "", false},
		{"-", "", "", false},
		{"C:/windows", "C", "/windows", true}, // a Machine named C, as kubectl cp would take it
	} {
		machine, path, ok := remoteSpec(c.arg)
		if machine != c.machine || path != c.path || ok != c.ok {
			t.Errorf("%q: %q %q %v, want %q %q %v", c.arg, machine, path, ok, c.machine, c.path, c.ok)
		}
	}
}

func TestExitResult(t *testing.T) {
	for _, c := range []struct {
		exit wire.Exit
		code int
		msg  string
	}{
		{wire.Exit{}, 0, ""},
		{wire.Exit{Code: 3}, 3, ""},
		{wire.Exit{Code: -1, Signal: "KILL"}, 137, ""},
		{wire.Exit{Code: -1, Signal: "TERM"}, 143, ""},
		{wire.Exit{Code: -1, Signal: "KILL", TimedOut: true}, 124, "timed out"},
		{wire.Exit{Code: 127, Error: "not found"}, 127, "x: not found"},
		{wire.Exit{Code: -1, Error: "channel closed"}, 1, "x: channel closed"},
	} {
		err := exitResult(&c.exit, "x")
		code, msg := 0, ""
		if e, ok := err.(*ExitCodeError); ok {
			code, msg = e.Code, e.Message
		} else if err != nil {
			t.Fatalf("%+v: %v", c.exit, err)
		}
		if code != c.code || !strings.Contains(msg, c.msg) || (c.msg == "" && msg != "") {
			t.Errorf("%+v: exit %d %q, want %d %q", c.exit, code, msg, c.code, c.msg)
		}
	}
}

// TestEscapeReader: the bytes before Ctrl-] pass, Ctrl-] calls escape and
// ends the input, whatever the reads' sizes.
func TestEscapeReader(t *testing.T) {
	escaped := 0
	r := &escapeReader{r: iotest.OneByteReader(strings.NewReader("ls\r\x1dnever")), escape: func() { escaped++ }}
	got, err := io.ReadAll(r)
	if string(got) != "ls\r" || err != nil || escaped != 1 {
		t.Errorf("read %q %v, escaped %d times; want %q, once", got, err, escaped, "ls\r")
	}
	escaped = 0
	r = &escapeReader{r: strings.NewReader("echo hi\r\x1dnever"), escape: func() { escaped++ }}
	got, _ = io.ReadAll(r)
	if string(got) != "echo hi\r" || escaped != 1 {
		t.Errorf("one read: %q, escaped %d times", got, escaped)
	}
}
