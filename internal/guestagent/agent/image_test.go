package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/guestagent/client"
	"github.com/zyvor/kairon/internal/guestagent/wire"
	"github.com/zyvor/kairon/internal/imagefs"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/host"
)

// writeTree makes files under root: a path ending in / is a directory, a
// value starting with "->" a symlink, any other a file (mode 0755 when
// its value starts with "#!").
func writeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		v, p := files[n], filepath.Join(root, n)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch {
		case strings.HasSuffix(n, "/"):
			err = os.MkdirAll(p, 0o755)
		case strings.HasPrefix(v, "->"):
			err = os.Symlink(v[2:], p)
		case strings.HasPrefix(v, "#!"):
			err = os.WriteFile(p, []byte(v), 0o755)
		default:
			err = os.WriteFile(p, []byte(v), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestLookPathInRoot(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"usr/bin/tool":      "#!tool",
		"usr/bin/data":      "not a program",
		"usr/bin/adir/":     "",
		"bin":               "->usr/bin",
		"opt/app/run":       "#!run",
		"opt/link-out":      "->/bin/sh",
		"opt/dotdot":        "->../../../../../../bin/sh",
		"srv/rel/script":    "#!script",
		"sbin/only-in-sbin": "#!sbin",
	})
	for _, tc := range []struct {
		name, file, path, dir string
		want                  string
		err                   string
	}{
		{"in PATH", "tool", "/usr/local/bin:/usr/bin", "/", "/usr/bin/tool", ""},
		{"through a symlinked directory", "tool", "/bin", "/", "/bin/tool", ""},
		{"first match wins", "tool", "/bin:/usr/bin", "/", "/bin/tool", ""},
		{"relative PATH entries are ignored", "tool", "usr/bin:.:", "/usr/bin", "", "no such program in the image's PATH"},
		{"not executable", "data", "/usr/bin", "/", "", "no such program"},
		{"a directory", "adir", "/usr/bin", "/", "", "no such program"},
		{"not in PATH", "only-in-sbin", "/usr/bin", "/", "", `"only-in-sbin": no such program in the image's PATH (/usr/bin)`},
		{"absolute", "/opt/app/run", "", "/", "/opt/app/run", ""},
		{"relative to dir", "./script", "", "/srv/rel", "/srv/rel/script", ""},
		{"relative with a subdirectory", "rel/script", "", "/srv", "/srv/rel/script", ""},
		{"absolute, missing", "/bin/sh", DefaultPath, "/", "", "/bin/sh: no such program in the image"},
		{"a symlink out of the root", "/opt/link-out", "", "/", "", "no such program in the image"},
		{"a .. symlink out of the root", "/opt/dotdot", "", "/", "", "no such program in the image"},
		{"sh, which the host has", "sh", DefaultPath, "/", "", `"sh": no such program in the image's PATH`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := lookPathInRoot(root, tc.file, tc.path, tc.dir)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %q, %v; want an error with %q", got, err, tc.err)
				}
				if strings.Contains(tc.err, "no such program") && !errors.Is(err, exec.ErrNotFound) {
					t.Errorf("%v does not wrap exec.ErrNotFound", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestMergeEnv(t *testing.T) {
	got := mergeEnv([]string{"PATH=/bin", "HOME=/root"}, validEnv([]string{"A=1", "PATH=/usr/bin", "=bad", "nothing", "B=x\x00y", "HOME="}), []string{"A=2", "C=3"})
	want := []string{"PATH=/usr/bin", "HOME=", "A=2", "C=3"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("mergeEnv = %q, want %q", got, want)
	}
	if v := envValue(got, "PATH"); v != "/usr/bin" {
		t.Errorf("envValue PATH = %q", v)
	}
}

// Command takes the image's defaults (user, working directory, Env over
// a default PATH, HOME from the user) and lets a request override each.
func TestImageCommand(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"etc/passwd":     "root:x:0:0::/root:\napp:x:1000:1000::/home/app:\n",
		"etc/group":      "staff:x:50:app\n",
		"usr/bin/prog":   "#!prog",
		"custom/bin/alt": "#!alt",
	})
	img := &Image{Root: root, Config: imagefs.Config{Env: []string{"GREETING=hi", "MODE=image"}, WorkingDir: "/work", User: "app"}}
	cmd, err := img.Command([]string{"prog", "-x"}, nil, "", "", false)
	if err != nil {
		t.Fatal(err)
	}
	want := &syscall.SysProcAttr{Chroot: root, Credential: &syscall.Credential{Uid: 1000, Gid: 1000, Groups: []uint32{50}}}
	if cmd.Path != "/usr/bin/prog" || !reflect.DeepEqual(cmd.Args, []string{"prog", "-x"}) || cmd.Dir != "/work" ||
		!reflect.DeepEqual(cmd.Env, []string{"PATH=" + DefaultPath, "HOME=/home/app", "GREETING=hi", "MODE=image"}) ||
		!reflect.DeepEqual(cmd.SysProcAttr, want) {
		t.Errorf("defaults: %+v %+v", cmd, cmd.SysProcAttr)
	}
	cmd, err = img.Command([]string{"alt"}, []string{"PATH=/custom/bin", "MODE=request"}, "/tmp", "0", true)
	if err != nil {
		t.Fatal(err)
	}
	if cmd.Path != "/custom/bin/alt" || cmd.Dir != "/tmp" || cmd.SysProcAttr.Credential.Uid != 0 ||
		!reflect.DeepEqual(cmd.Env, []string{"PATH=/custom/bin", "HOME=/root", "TERM=xterm", "GREETING=hi", "MODE=request"}) {
		t.Errorf("overridden: %+v %+v", cmd, cmd.SysProcAttr.Credential)
	}
	if _, err := img.Command([]string{"prog"}, nil, "", "ghost", false); err == nil || !strings.Contains(err.Error(), `user "ghost"`) {
		t.Errorf("an unknown user: %v", err)
	}
	if _, err := img.Command([]string{"sh"}, nil, "", "", false); !errors.Is(err, exec.ErrNotFound) {
		t.Errorf("a program the image lacks: %v", err)
	}
}

// helloProgram is a static program, built once: it prints its uid, gid,
// working directory and environment; with "exit N" it prints a line and
// exits N; with "sleep" it waits to be killed.
var helloProgram = sync.OnceValues(func() ([]byte, error) {
	dir, err := os.MkdirTemp("", "kairon-agent-hello-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	src := `package main

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"time"
)

func main() {
	if len(os.Args) > 2 && os.Args[1] == "exit" {
		fmt.Println("main says hello")
		n, _ := strconv.Atoi(os.Args[2])
		os.Exit(n)
	}
	if len(os.Args) > 1 && os.Args[1] == "sleep" {
		time.Sleep(time.Hour)
	}
	wd, _ := os.Getwd()
	env := os.Environ()
	sort.Strings(env)
	fmt.Printf("uid=%d gid=%d cwd=%s\n", os.Getuid(), os.Getgid(), wd)
	for _, e := range env {
		fmt.Println(e)
	}
}
`
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command("go", "build", "-o", "hello", "main.go")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, errors.New(err.Error() + ": " + string(out))
	}
	return os.ReadFile(filepath.Join(dir, "hello"))
})

// helloImage is an image root holding only the static hello program (as
// /app/hello), and what extra adds.
func helloImage(t *testing.T, extra map[string]string) string {
	t.Helper()
	host.SkipIfShort(t, "root, to chroot, and the go tool")
	if os.Geteuid() != 0 {
		t.Fatal("needs root, to chroot")
	}
	prog, err := helloProgram()
	if err != nil {
		t.Fatalf("building the static test program: %v", err)
	}
	root := t.TempDir()
	// The root must be reachable by the image's users, as / is.
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	writeTree(t, root, extra)
	if err := os.MkdirAll(filepath.Join(root, "app"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "app", "hello"), prog, 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

// imageClient is a Client of an Agent serving img over a socket pair.
func imageClient(t *testing.T, img *Image) *client.Client {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	hostF, guest := os.NewFile(uintptr(fds[0]), "host"), os.NewFile(uintptr(fds[1]), "guest")
	go func() { _ = New(Options{Image: img}).Serve(guest) }()
	conn, err := net.FileConn(hostF)
	hostF.Close()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(context.Background(), conn, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); guest.Close() })
	return c
}

// An image guest's exec runs in the image's root: its program, found in
// its PATH (not the agent's), as its user, in its working directory; a
// program it lacks is a clear 127, whatever the agent's own root has.
// Files are read and written inside the root.
func TestImageExecInRoot(t *testing.T) {
	root := helloImage(t, map[string]string{"data/": "", "escape": "->/etc/hostname"})
	img := &Image{Root: root, Config: imagefs.Config{Env: []string{"PATH=/app"}, WorkingDir: "/data", User: "4242:4343"}}
	c := imageClient(t, img)
	ctx := context.Background()
	run := func(e *wire.Exec) (client.Result, string, error) {
		var out bytes.Buffer
		res, err := c.Exec(ctx, e, nil, &out, io.Discard)
		return res, out.String(), err
	}
	res, out, err := run(&wire.Exec{Args: []string{"hello"}})
	if err != nil || res.Code != 0 || !strings.HasPrefix(out, "uid=4242 gid=4343 cwd=/data\nHOME=/\nPATH=/app\n") {
		t.Errorf("hello: %+v %v\n%s", res, err, out)
	}
	res, out, err = run(&wire.Exec{Args: []string{"/app/hello"}, User: "0:0", Dir: "/", Env: []string{"X=1"}, TTY: true})
	if err != nil || res.Code != 0 || !strings.HasPrefix(out, "uid=0 gid=0 cwd=/\r\nHOME=/root\r\nPATH=/app\r\nTERM=xterm\r\nX=1\r\n") {
		t.Errorf("hello as root on a TTY: %+v %v\n%q", res, err, out)
	}
	var ee *client.ExitError
	if _, _, err := run(&wire.Exec{Args: []string{"sh", "-c", "true"}}); !errors.As(err, &ee) || ee.Code != 127 || !strings.Contains(ee.Reason, `"sh": no such program in the image's PATH (/app)`) {
		t.Errorf("sh: %v", err)
	}
	if _, _, err := run(&wire.Exec{Args: []string{"hello"}, Dir: "/missing"}); !errors.As(err, &ee) || ee.Code != 127 || !strings.Contains(ee.Reason, "no such file") {
		t.Errorf("a missing directory: %v", err)
	}

	// Files: written inside the root, owned by the image's user; a symlink
	// out of the root is followed inside it.
	if _, err := c.WriteFile(ctx, "/data/in.txt", 0o600, strings.NewReader("copied in")); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(root, "data", "in.txt"))
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Sys().(*syscall.Stat_t).Uid != 4242 || fi.Sys().(*syscall.Stat_t).Gid != 4343 {
		t.Errorf("the written file: %v %v", fi, err)
	}
	var back bytes.Buffer
	if _, err := c.ReadFile(ctx, "/data/in.txt", &back); err != nil || back.String() != "copied in" {
		t.Errorf("read back: %q %v", back.String(), err)
	}
	if _, err := c.ReadFile(ctx, "/escape", io.Discard); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("reading through a symlink out of the root: %v", err)
	}
	ents, _ := os.ReadDir(filepath.Join(root, "data"))
	if len(ents) != 1 {
		t.Errorf("left in /data: %v", ents)
	}
}

// In the default guest (no image) exec.user runs the program as that
// user too, resolved with the guest's own /etc/passwd.
func TestDefaultGuestExecUser(t *testing.T) {
	host.SkipIfShort(t, "root, to run as another user")
	if os.Geteuid() != 0 {
		t.Fatal("needs root, to run as another user")
	}
	c := imageClient(t, nil)
	var out bytes.Buffer
	res, err := c.Exec(context.Background(), &wire.Exec{Args: []string{"sh", "-c", "id -u; id -g"}, User: "65534:65533"}, nil, &out, io.Discard)
	if err != nil || res.Code != 0 || out.String() != "65534\n65533\n" {
		t.Errorf("as 65534:65533: %+v %v %q", res, err, out.String())
	}
	out.Reset()
	res, err = c.Exec(context.Background(), &wire.Exec{Args: []string{"id", "-u"}}, nil, &out, io.Discard)
	if err != nil || res.Code != 0 || out.String() != "0\n" {
		t.Errorf("without a user: %+v %v %q", res, err, out.String())
	}
}

// RunMain runs the image's main process once, records it running and
// then how it ended; an image without one records nothing, one whose
// program is missing records 127.
func TestRunMain(t *testing.T) {
	root := helloImage(t, nil)
	state := filepath.Join(t.TempDir(), "main.json")
	img := &Image{Root: root, Config: imagefs.Config{Entrypoint: []string{"/app/hello"}, Cmd: []string{"exit", "3"}, User: "7"}}
	var out bytes.Buffer
	m, err := RunMain(img, &out, &out, state)
	if err != nil || *m != (wire.MainProcess{State: wire.MainExited, ExitCode: 3}) || out.String() != "main says hello\n" {
		t.Fatalf("RunMain: %+v %v, output %q", m, err, out.String())
	}
	a := New(Options{MainStateFile: state})
	if st := a.status(); st.Main == nil || *st.Main != *m {
		t.Errorf("status: %+v", st.Main)
	}

	// Running, then killed.
	img.Config.Cmd = []string{"sleep"}
	done := make(chan *wire.MainProcess, 1)
	go func() {
		m, _ := RunMain(img, io.Discard, io.Discard, state)
		done <- m
	}()
	var pid int
	testenv.Eventually(t, 30*time.Second, "the main process to run", func() (bool, string) {
		st := a.status()
		if st.Main != nil && st.Main.State == wire.MainRunning {
			pid = findProcess(t, "/app/hello", "sleep")
		}
		return pid != 0, fmt.Sprintf("status %+v, pid %d", st.Main, pid)
	})
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if m := <-done; *m != (wire.MainProcess{State: wire.MainExited, ExitCode: -1, Signal: "KILL"}) {
		t.Errorf("killed: %+v", m)
	}
	if st := a.status(); *st.Main != (wire.MainProcess{State: wire.MainExited, ExitCode: -1, Signal: "KILL"}) {
		t.Errorf("status after the kill: %+v", st.Main)
	}

	img.Config.Entrypoint, img.Config.Cmd = []string{"missing"}, nil
	out.Reset()
	if m, err := RunMain(img, &out, &out, state); err != nil || *m != (wire.MainProcess{State: wire.MainExited, ExitCode: 127}) || !strings.Contains(out.String(), "no such program") {
		t.Errorf("a missing program: %+v %v %q", m, err, out.String())
	}
	os.Remove(state)
	img.Config.Entrypoint = nil
	if m, err := RunMain(img, &out, &out, state); m != nil || err != nil {
		t.Errorf("no main process: %+v %v", m, err)
	}
	if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) || a.status().Main != nil {
		t.Errorf("no main process recorded a state: %v", err)
	}
	// A state file that is not one (the guest is untrusted to the host,
	// but the agent checks too) reports nothing.
	if err := os.WriteFile(state, []byte(`{"state":"exited","exitCode":999}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if a.status().Main != nil {
		t.Error("an invalid state reported")
	}
}

// findProcess is the PID of a process running exe with arg (polled: the
// caller saw it started).
func findProcess(t *testing.T, exe, arg string) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && string(b) == exe+"\x00"+arg+"\x00" {
			var pid int
			for _, r := range e.Name() {
				pid = pid*10 + int(r-'0')
			}
			return pid
		}
	}
	return 0
}
