package e2e

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// TestKaironctlExecInARealGuest: kaironctl exec and cp (the bin/
// binaries) against a real QEMU guest through kairon-node and the guest
// agent on its virtio-serial port: echo, exit codes 0 and 3, 10 MB of
// stdout intact, stdin passed through, and a 20 MB file copied in and out.
func TestKaironctlExecInARealGuest(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	netNS := netns(t)
	state := t.TempDir()
	t.Cleanup(func() { killVMs(t, state) })
	startController(t, env)
	a := startAgent(t, env, "e2e-exec", state, netNS)
	deleteNodeAtEnd(t, env, "e2e-exec")
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := os.ReadFile(a.log)
			t.Logf("kairon-node log:\n%s", tail(string(out), 40))
		}
	})
	env.KubectlStdin(t, "apiVersion: kairon.zyvor.dev/v1alpha1\nkind: Machine\nmetadata:\n  name: box\nspec: {}\n", "-n", ns, "apply", "-f", "-")
	waitPhase(t, env, client.ObjectKey{Namespace: ns, Name: "box"}, kaironv1.MachineRunning)

	kaironctl := func(stdin []byte, args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(filepath.Join(env.BinDir, "kaironctl"), append([]string{"--kubeconfig", env.Kubeconfig, "-n", ns}, args...)...)
		var out, errb bytes.Buffer
		cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(stdin), &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), errb.String(), code
	}

	if out, stderr, code := kaironctl(nil, "exec", "box", "--", "echo", "hello", "from", "the", "guest"); out != "hello from the guest\n" || code != 0 {
		t.Errorf("exec echo: %q %q exit %d", out, stderr, code)
	}
	if _, stderr, code := kaironctl(nil, "exec", "box", "--", "true"); code != 0 {
		t.Errorf("exec true: %q exit %d", stderr, code)
	}
	if out, stderr, code := kaironctl(nil, "exec", "box", "--", "sh", "-c", "echo three; exit 3"); out != "three\n" || code != 3 {
		t.Errorf("exec exit 3: %q %q exit %d", out, stderr, code)
	}

	const size = 10 << 20
	out, stderr, code := kaironctl(nil, "exec", "box", "--", "sh", "-c", fmt.Sprintf("yes 0123456789abcdef | head -c %d", size))
	want := sha256.Sum256(bytes.Repeat([]byte("0123456789abcdef\n"), size/17+1)[:size])
	if got := sha256.Sum256([]byte(out)); got != want || code != 0 {
		t.Errorf("10 MB of stdout: %d bytes, exit %d, %q: sha256 differs", len(out), code, stderr)
	}

	in := bytes.Repeat([]byte("through stdin\n"), 50000)
	if out, stderr, code := kaironctl(in, "exec", "-i", "box", "--", "sha256sum"); out != fmt.Sprintf("%x  -\n", sha256.Sum256(in)) || code != 0 {
		t.Errorf("stdin: the guest's sha256sum %q %q exit %d", out, stderr, code)
	}

	dir := t.TempDir()
	data := bytes.Repeat([]byte("twenty megabytes of file "), (20<<20)/25+1)[:20<<20]
	src := filepath.Join(dir, "src.bin")
	if err := os.WriteFile(src, data, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := kaironctl(nil, "cp", src, "box:/tmp/big.bin"); code != 0 {
		t.Fatalf("cp in: %q exit %d", stderr, code)
	}
	if out, stderr, code := kaironctl(nil, "exec", "box", "--", "sh", "-c", "sha256sum /tmp/big.bin; stat -c %a /tmp/big.bin"); out != fmt.Sprintf("%x  /tmp/big.bin\n640\n", sha256.Sum256(data)) || code != 0 {
		t.Errorf("the guest's copy: %q %q exit %d", out, stderr, code)
	}
	back := filepath.Join(dir, "back.bin")
	if _, stderr, code := kaironctl(nil, "cp", "box:/tmp/big.bin", back); code != 0 {
		t.Fatalf("cp out: %q exit %d", stderr, code)
	}
	if got, err := os.ReadFile(back); err != nil || sha256.Sum256(got) != sha256.Sum256(data) {
		t.Errorf("cp round trip of 20 MB: %d bytes, %v: sha256 differs", len(got), err)
	}
	if _, stderr, code := kaironctl(nil, "exec", "box", "--", "/no/such/program"); code == 0 || !strings.Contains(stderr, "exec in machine "+ns+"/box") {
		t.Errorf("a missing program: %q exit %d", stderr, code)
	}

	t.Run("console in tmux", func(t *testing.T) { consoleInTmux(t, env, ns, "box") })
	t.Run("exec -it in tmux", func(t *testing.T) { interactiveExecInTmux(t, env, ns, "box") })
}

// tmuxSession runs command in a detached tmux session of its own server
// (120x40) and returns a function running tmux commands on it and one
// capturing its screen.
func tmuxSession(t *testing.T, name, command string) (tmux func(args ...string) string, screen func() string) {
	tmuxPath, err := exec.LookPath("tmux")
	if err != nil {
		t.Fatal("tmux not found: install Debian's tmux (make deps does)")
	}
	socket := "kairon-e2e-" + name
	tmux = func(args ...string) string {
		t.Helper()
		out, err := exec.Command(tmuxPath, append([]string{"-L", socket}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	tmux("new-session", "-d", "-s", "s", "-x", "120", "-y", "40", command)
	t.Cleanup(func() { _ = exec.Command(tmuxPath, "-L", socket, "kill-server").Run() })
	return tmux, func() string { return tmux("capture-pane", "-p", "-t", "s", "-S", "-100") }
}

// interactiveExecInTmux: `kaironctl exec -it MACHINE -- sh` in a tmux
// terminal gets a pseudo-terminal of the terminal's size, follows a
// resize, and exits with the shell's code.
func interactiveExecInTmux(t *testing.T, env *testenv.Env, ns, machine string) {
	tmux, screen := tmuxSession(t, ns+"-it", fmt.Sprintf("%s --kubeconfig %s -n %s exec -it %s -- sh; echo EXITED:$?; sleep 600",
		filepath.Join(env.BinDir, "kaironctl"), env.Kubeconfig, ns, machine))
	testenv.Eventually(t, guestTimeout, "a shell prompt", func() (bool, string) {
		s := screen() // tmux trims the prompt's trailing space
		return strings.Contains(s, "#"), s
	})
	tmux("send-keys", "-t", "s", "tty; stty size", "Enter")
	testenv.Eventually(t, guestTimeout, "the pseudo-terminal's size", func() (bool, string) {
		s := screen()
		return strings.Contains(s, "/dev/pts/") && strings.Contains(s, "\n40 120"), s
	})
	tmux("resize-window", "-t", "s", "-x", "100", "-y", "30")
	// The new size travels on its own (SIGWINCH to kaironctl, a message to
	// the guest agent, an ioctl on the guest's pty), so a `stty size` typed
	// right after the resize may still print the old one: ask again until
	// the new size shows.
	var asked time.Time
	testenv.Eventually(t, guestTimeout, "the size after a resize", func() (bool, string) {
		s := screen()
		if strings.Contains(s, "\n30 100") {
			return true, s
		}
		if time.Since(asked) > time.Second {
			tmux("send-keys", "-t", "s", "stty size", "Enter")
			asked = time.Now()
		}
		return false, s
	})
	tmux("send-keys", "-t", "s", "exit 7", "Enter")
	testenv.Eventually(t, guestTimeout, "the shell's exit code", func() (bool, string) {
		s := screen()
		return strings.Contains(s, "EXITED:7"), s
	})
}

// consoleInTmux drives `kaironctl console` in a tmux terminal: the
// guest's shell on the serial console answers `tty`, and Ctrl-] leaves
// with exit 0.
func consoleInTmux(t *testing.T, env *testenv.Env, ns, machine string) {
	tmux, screen := tmuxSession(t, ns+"-console", fmt.Sprintf("%s --kubeconfig %s -n %s console %s; echo EXITED:$?; sleep 600",
		filepath.Join(env.BinDir, "kaironctl"), env.Kubeconfig, ns, machine))
	testenv.Eventually(t, guestTimeout, "attached", func() (bool, string) {
		s := screen()
		return strings.Contains(s, "press Ctrl-] to leave"), s
	})
	// An Enter first: the shell's prompt was printed before we attached.
	tmux("send-keys", "-t", "s", "Enter")
	tmux("send-keys", "-t", "s", "tty", "Enter")
	testenv.Eventually(t, guestTimeout, "the guest's tty answer", func() (bool, string) {
		s := screen()
		return strings.Contains(s, "/dev/tty") || strings.Contains(s, "/dev/console"), s
	})
	tmux("send-keys", "-t", "s", "C-]")
	testenv.Eventually(t, guestTimeout, "kaironctl leaving on Ctrl-]", func() (bool, string) {
		s := screen()
		return strings.Contains(s, "EXITED:0") && strings.Contains(s, "Left the console"), s
	})
}

const guestTimeout = 60 * time.Second

// TestKaironctlExecAfterLiveMigration: kaironctl exec reaches a real guest
// before and after a live migration to another node, and it is the same
// guest (a file it wrote in memory before is there after).
func TestKaironctlExecAfterLiveMigration(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	netNS := netns(t)
	// Short: the VMs' sockets are created where QEMU runs.
	state, err := os.MkdirTemp("", "kexm-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(state) })
	t.Cleanup(func() { killVMs(t, state) })
	first, second := ns+"-a", ns+"-b"
	startController(t, env)
	agents := map[string]*agent{}
	for i, name := range []string{first, second} {
		agents[name] = startAgentWith(t, env, name, filepath.Join(state, name[len(name)-1:]), netNS, 2, "2Gi",
			"--network-cidr", "10.88.0.0/16", "--address-pool", fmt.Sprintf("10.88.%d.0/24", 71+i),
			"--migration-listen", "127.0.0.1:0")
		deleteNodeAtEnd(t, env, name)
		waitNodeReady(t, env, name)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for name, a := range agents {
				out, _ := os.ReadFile(a.log)
				t.Logf("kairon-node %s log:\n%s", name, tail(string(out), 30))
			}
		}
	})
	env.KubectlStdin(t, fmt.Sprintf("apiVersion: kairon.zyvor.dev/v1alpha1\nkind: Machine\nmetadata:\n  name: mover\nspec: {nodeName: %s}\n", first), "-n", ns, "apply", "-f", "-")
	waitPhase(t, env, client.ObjectKey{Namespace: ns, Name: "mover"}, kaironv1.MachineRunning)

	kaironctl := func(args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(filepath.Join(env.BinDir, "kaironctl"), append([]string{"--kubeconfig", env.Kubeconfig, "-n", ns}, args...)...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); ok {
			return out.String(), errb.String(), ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), errb.String(), 0
	}
	if out, stderr, code := kaironctl("exec", "mover", "--", "sh", "-c", "echo remembered >/tmp/before; cat /tmp/before"); out != "remembered\n" || code != 0 {
		t.Fatalf("exec before the migration: %q %q exit %d", out, stderr, code)
	}
	env.KubectlStdin(t, fmt.Sprintf("apiVersion: kairon.zyvor.dev/v1alpha1\nkind: MachineMigration\nmetadata: {name: move}\nspec: {machineName: mover, strategy: live, targetNode: %s}\n", second), "-n", ns, "apply", "-f", "-")
	testenv.Eventually(t, 3*time.Minute, "the live migration to end", func() (bool, string) {
		out := jsonpathQuiet(env, testenv.Query{Namespace: ns, Resource: "machinemigration", Name: "move"}, "{.status.phase} {.status.reason} {.status.message}")
		if strings.HasPrefix(out, "Failed") {
			t.Fatalf("migration failed: %s", out)
		}
		return strings.HasPrefix(out, "Succeeded"), out
	})
	m := waitPhase(t, env, client.ObjectKey{Namespace: ns, Name: "mover"}, kaironv1.MachineRunning)
	if m.Spec.NodeName != second {
		t.Fatalf("the Machine is on %q after the migration, want %s", m.Spec.NodeName, second)
	}
	if out, stderr, code := kaironctl("exec", "mover", "--", "sh", "-c", "cat /tmp/before; exit 3"); out != "remembered\n" || code != 3 {
		t.Errorf("exec after the live migration: %q %q exit %d, want the file written before and exit 3", out, stderr, code)
	}
}
