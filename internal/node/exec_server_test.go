package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/execstream"
	guestagent "github.com/zyvor/kairon/internal/guestagent/agent"
	"github.com/zyvor/kairon/internal/guestagent/wire"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/guestsim"
)

// execReviewer: token "runner" may exec in namespace ns, token "reader"
// may only read consoles there.
type execReviewer struct{}

func (execReviewer) reviewToken(_ context.Context, token string) (consoleUser, bool, error) {
	return consoleUser{name: token, groups: []string{"team"}}, token == "runner" || token == "reader", nil
}

func (execReviewer) mayAccess(_ context.Context, user consoleUser, access machineAccess, namespace, _ string) (bool, error) {
	if namespace != "ns" {
		return false, nil
	}
	return access == readConsole || user.name == "runner", nil
}

func (execReviewer) mayImpersonate(context.Context, consoleUser, impersonationTarget) (bool, error) {
	return false, nil
}

// logLines collects log lines.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) add(prefix, args string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, prefix+" "+args)
}

func (l *logLines) find(parts ...string) (bool, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true, line
		}
	}
	return false, strings.Join(l.lines, "\n")
}

// execServer serves an agent's handler over plain HTTP (the upgrade is
// the same over TLS) with a backend of one running Machine ns/vm, with a
// guest agent unless plain; its logs go to the returned lines.
func execServer(t *testing.T, plain bool) (string, *guestsim.Guest, *logLines) {
	t.Helper()
	return execServerWith(t, plain, execReviewer{})
}

// execServerWith is execServer whose agent asks reviewer.
func execServerWith(t *testing.T, plain bool, reviewer accessReviewer) (string, *guestsim.Guest, *logLines) {
	t.Helper()
	b, err := sim.New(sim.Options{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Start(context.Background(), backend.Spec{ID: "ns_vm", Name: "ns/vm"}); err != nil {
		t.Fatal(err)
	}
	var be backend.Backend = b
	var guest *guestsim.Guest
	if !plain {
		gb := guestsim.New(t, b)
		be, guest = gb, gb.Guest("ns_vm")
	}
	a := &Agent{opts: Options{NodeName: "n1", Backend: be}, consoleAuth: newConsoleAuth(reviewer)}
	logs := &logLines{}
	srv := httptest.NewUnstartedServer(a.handler())
	srv.Config.BaseContext = func(net.Listener) context.Context {
		return log.IntoContext(context.Background(), funcr.New(logs.add, funcr.Options{}))
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL, guest, logs
}

// upgradeAs opens an execstream as token.
func upgradeAs(t *testing.T, url, token string) (io.ReadWriteCloser, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return execstream.Upgrade(ctx, bearer{token}, url, nil)
}

type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// TestExecEndpointRefusals: every refusal is an HTTP status before the
// upgrade, in the documented order, and none reaches the guest; refusals
// are logged with who asked.
func TestExecEndpointRefusals(t *testing.T) {
	url, guest, logs := execServer(t, false)
	exec := url + "/v1/machines/ns/vm/exec?command=true"
	for _, c := range []struct {
		what, token, url string
		code             int
		msg              string
	}{
		{"no credentials", "", exec, 401, "Unauthorized"},
		{"a forged token", "forged", exec, 401, "Unauthorized"},
		{"a console reader", "reader", exec, 403, "Forbidden"},
		{"a console reader attaching", "reader", url + "/v1/machines/ns/vm/console/attach", 403, "Forbidden"},
		{"a console reader reading a file", "reader", url + "/v1/machines/ns/vm/files/read?path=/etc/hostname", 403, "Forbidden"},
		{"a runner in another namespace", "runner", url + "/v1/machines/other/vm/exec?command=true", 403, "Forbidden"},
		{"a traversal", "runner", url + "/v1/machines/ns/..%2Fvm/exec?command=true", 400, "bad path"},
		{"no command", "runner", url + "/v1/machines/ns/vm/exec", 400, "command is required"},
		{"a relative path", "runner", url + "/v1/machines/ns/vm/files/read?path=etc/hostname", 400, "path"},
		{"a bad mode", "runner", url + "/v1/machines/ns/vm/files/write?path=/tmp/x&mode=99", 400, "mode must be octal"},
		{"a timeout past a day", "runner", exec + "&timeout=90000", 400, "timeout"},
		{"an unknown machine", "runner", url + "/v1/machines/ns/gone/exec?command=true", 404, "no machine ns/gone on node n1"},
	} {
		_, err := upgradeAs(t, c.url, c.token)
		var status *execstream.StatusError
		if !errors.As(err, &status) || status.Code != c.code || !strings.Contains(status.Message, c.msg) {
			t.Errorf("%s: %v, want %d %q", c.what, err, c.code, c.msg)
		}
	}
	if guest.Connections() != 0 {
		t.Errorf("refused requests reached the guest: %d connections", guest.Connections())
	}
	if ok, line := logs.find(`"refused"`, `"user"="reader"`, `"machine"="ns/vm"`, `"needs"="create machines/exec"`); !ok {
		t.Errorf("no log of the refused exec; logs:\n%s", line)
	}
	// Without the upgrade: refused, after authorization.
	req, _ := http.NewRequest(http.MethodPost, exec, nil)
	req.Header.Set("Authorization", "Bearer runner")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("exec without Upgrade: %d, want 400", resp.StatusCode)
	}
}

// TestExecOnSimBackendSaysSo: the sim backend has no guest agent channel.
func TestExecOnSimBackendSaysSo(t *testing.T) {
	url, _, _ := execServer(t, true)
	for _, path := range []string{"exec?command=true", "files/read?path=/etc/hostname", "console/attach"} {
		_, err := upgradeAs(t, url+"/v1/machines/ns/vm/"+path, "runner")
		var status *execstream.StatusError
		if !errors.As(err, &status) || status.Code != http.StatusNotImplemented || !strings.Contains(status.Message, "machine ns/vm runs on the sim backend") {
			t.Errorf("%s on sim: %v, want 501 naming the backend", path, err)
		}
	}
}

// TestExecSessionIsLogged: a session's log names who ran what and how it
// ended.
func TestExecSessionIsLogged(t *testing.T) {
	url, _, logs := execServer(t, false)
	conn, err := upgradeAs(t, url+"/v1/machines/ns/vm/exec?command=sh&command=-c&command=exit+3", "runner")
	if err != nil {
		t.Fatal(err)
	}
	exit, err := execstream.Run(context.Background(), conn, execstream.Session{})
	if err != nil || exit.Code != 3 {
		t.Fatalf("exit %+v %v, want code 3", exit, err)
	}
	testenv.Eventually(t, 10*time.Second, "the session's log", func() (bool, string) {
		return logs.find(`"session ended"`, `"op"="exec"`, `"user"="runner"`, `"groups"=["team"]`, `"machine"="ns/vm"`, `"command"="sh -c exit 3"`, `"exitCode"=3`, `"duration"=`)
	})
}

// TestExecClientStreamIsParsedDefensively: a client that sends garbage,
// an oversized frame, stdin the session does not take, or hangs up ends
// its own session (the program is killed) and nothing else.
func TestExecClientStreamIsParsedDefensively(t *testing.T) {
	url, _, _ := execServer(t, false)
	header := func(typ wire.Type, length uint32) []byte {
		return []byte{'K', 'G', wire.Version, byte(typ), 0, 0, 0, execstream.StreamID, byte(length >> 24), byte(length >> 16), byte(length >> 8), byte(length)}
	}
	for _, c := range []struct {
		what  string
		stdin bool
		send  []byte
	}{
		{"garbage", true, []byte("GET / HTTP/1.1\r\n\r\n")},
		{"a 4 GiB frame announced", true, header(wire.TypeStdin, 1<<32-1)},
		{"a control frame past its limit", true, header(wire.TypeResize, wire.MaxControlPayload+1)},
		{"stdin the session does not take", false, append(header(wire.TypeStdin, 1), 'x')},
		{"a frame the client may not send", true, append(header(wire.TypeExit, 10), []byte(`{"code":0}`)...)},
		{"a hang-up", true, nil},
	} {
		u := url + "/v1/machines/ns/vm/exec?command=sleep&command=30"
		if c.stdin {
			u += "&stdin=true"
		}
		conn, err := upgradeAs(t, u, "runner")
		if err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		if _, err := conn.Write(c.send); err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		if c.send == nil {
			conn.Close()
			continue
		}
		// The node ends the session: an Exit for a killed program, then EOF.
		done := make(chan error, 1)
		go func() {
			exit, err := execstream.Run(context.Background(), conn, execstream.Session{Stdin: blockingReader{}})
			if err == nil && exit.Code == 0 && exit.Signal == "" {
				err = fmt.Errorf("the session ended normally: %+v", exit)
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, execstream.ErrNoExit) {
				t.Errorf("%s: %v", c.what, err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("%s: the session went on", c.what)
		}
	}
	// The node still serves.
	conn, err := upgradeAs(t, url+"/v1/machines/ns/vm/exec?command=echo&command=ok", "runner")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if exit, err := execstream.Run(context.Background(), conn, execstream.Session{Stdout: &out}); err != nil || exit.Code != 0 || out.String() != "ok\n" {
		t.Errorf("after the attacks: %q %+v %v", out.String(), exit, err)
	}
}

// blockingReader never gives data (nor an end).
type blockingReader struct{}

func (blockingReader) Read([]byte) (int, error) { select {} }

// TestFileWriteCutShortLeavesNothing: a client that hangs up in the middle
// of a file leaves no file in the guest, partial or whole.
func TestFileWriteCutShortLeavesNothing(t *testing.T) {
	url, _, logs := execServer(t, false)
	dst := filepath.Join(t.TempDir(), "partial")
	conn, err := upgradeAs(t, url+"/v1/machines/ns/vm/files/write?path="+dst+"&mode=0600", "runner")
	if err != nil {
		t.Fatal(err)
	}
	w := execstream.NewWriter(conn)
	if err := w.Data(wire.TypeStdin, bytes.Repeat([]byte("x"), 1<<20)); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	testenv.Eventually(t, 10*time.Second, "the cut write's log", func() (bool, string) {
		return logs.find(`"session ended"`, `"op"="write"`, `"user"="runner"`)
	})
	if _, err := os.Stat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a write cut short left %s: %v", dst, err)
	}
	// A whole one arrives.
	conn, err = upgradeAs(t, url+"/v1/machines/ns/vm/files/write?path="+dst+"&mode=0600", "runner")
	if err != nil {
		t.Fatal(err)
	}
	if exit, err := execstream.Run(context.Background(), conn, execstream.Session{Stdin: strings.NewReader("whole")}); err != nil || exit.Code != 0 || exit.Error != "" {
		t.Fatalf("write: %+v %v", exit, err)
	}
	if data, err := os.ReadFile(dst); err != nil || string(data) != "whole" {
		t.Errorf("written file: %q %v", data, err)
	}
	if st, err := os.Stat(dst); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v %v, want 0600", st.Mode().Perm(), err)
	}
}

// TestDialUnixLongPath: a socket whose path is longer than a socket
// address may be (a long state dir, namespace and name) is still reached.
func TestDialUnixLongPath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("n", 63)+"_"+strings.Repeat("m", 60))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Listen through the same short form the dialer uses.
	fd, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	ln, err := net.Listen("unix", fmt.Sprintf("/proc/self/fd/%d/agent.sock", fd.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			_, _ = c.Write([]byte("hi"))
			c.Close()
		}
	}()
	path := filepath.Join(dir, "agent.sock")
	if len(path) <= maxSocketPath {
		t.Fatalf("path %d bytes: not long enough to test", len(path))
	}
	conn, err := dialUnix(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if got, _ := io.ReadAll(conn); string(got) != "hi" {
		t.Errorf("read %q", got)
	}
}

// hostileGuest is a backend whose guest agent socket is served by serve,
// one connection at a time.
type hostileGuest struct {
	backend.Backend
	path string
}

func (h hostileGuest) AgentSocket(string) string { return h.path }

// TestHostileGuestChannel: a guest that answers garbage, or breaks the
// protocol in the middle of a session, fails that request (503, or the
// session's Exit with an error) and nothing else: the node agent serves on
// and dials the guest again for the next request, which a well-behaved
// agent then answers.
func TestHostileGuestChannel(t *testing.T) {
	b, err := sim.New(sim.Options{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Start(context.Background(), backend.Spec{ID: "ns_vm", Name: "ns/vm"}); err != nil {
		t.Fatal(err)
	}
	sockDir, err := os.MkdirTemp("", "hg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	path := filepath.Join(sockDir, "agent.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	behaviours := []func(net.Conn){
		// Garbage instead of Hello.
		func(c net.Conn) { _, _ = c.Write(bytes.Repeat([]byte("garbage "), 1<<12)) },
		// Hello, then a frame of 4 GiB announced once a session starts.
		func(c net.Conn) {
			fr := wire.NewReader(c)
			if _, err := fr.ReadFrame(); err != nil { // Hello
				return
			}
			hello, _ := wire.Encode(0, &wire.Hello{Versions: []int{wire.Version}, Agent: "hostile"})
			_ = wire.WriteFrame(c, hello)
			f, err := fr.ReadFrame() // the Request
			if err != nil {
				return
			}
			_, _ = c.Write([]byte{'K', 'G', wire.Version, byte(wire.TypeStdout), byte(f.Stream >> 24), byte(f.Stream >> 16), byte(f.Stream >> 8), byte(f.Stream), 0xff, 0xff, 0xff, 0xff})
			_, _ = io.Copy(io.Discard, c)
		},
	}
	go func() {
		for i := 0; ; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if i < len(behaviours) {
				behaviours[i](c)
			} else {
				_ = newTestAgent().Serve(c)
			}
			c.Close()
		}
	}()
	a := &Agent{opts: Options{NodeName: "n1", Backend: hostileGuest{Backend: b, path: path}}, consoleAuth: newConsoleAuth(execReviewer{})}
	srv := httptest.NewServer(a.handler())
	t.Cleanup(srv.Close)
	exec := srv.URL + "/v1/machines/ns/vm/exec?command=echo&command=ok"

	_, err = upgradeAs(t, exec, "runner")
	var status *execstream.StatusError
	if !errors.As(err, &status) || status.Code != http.StatusServiceUnavailable || !strings.Contains(status.Message, "does not answer") {
		t.Errorf("a guest answering garbage: %v, want 503", err)
	}
	conn, err := upgradeAs(t, exec, "runner")
	if err != nil {
		t.Fatalf("the second guest connection: %v", err)
	}
	exit, err := execstream.Run(context.Background(), conn, execstream.Session{})
	if err != nil || exit.Error == "" || exit.Code == 0 {
		t.Errorf("a guest breaking the protocol mid-session: %+v %v, want an Exit with an error", exit, err)
	}
	testenv.Eventually(t, 10*time.Second, "a well-behaved guest answering again", func() (bool, string) {
		conn, err := upgradeAs(t, exec, "runner")
		if err != nil {
			return false, err.Error()
		}
		var out bytes.Buffer
		exit, err := execstream.Run(context.Background(), conn, execstream.Session{Stdout: &out})
		return err == nil && exit.Code == 0 && out.String() == "ok\n", fmt.Sprintf("%q %+v %v", out.String(), exit, err)
	})
}

func newTestAgent() *guestagent.Agent {
	return guestagent.New(guestagent.Options{Name: "kairon-guest-agent/test", Configure: func(*wire.Configure) error { return nil }})
}
