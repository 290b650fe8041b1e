package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/testenv"
)

// down --purge removes a data dir's guest network (bridge, taps, nftables
// tables) from the namespace its record names, and nothing else there; not
// while another Kairon process runs in that namespace.
func TestPurgeGuestNetwork(t *testing.T) {
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	ns := "kl-purge-" + hex.EncodeToString(suffix)
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("ip", "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	run("ip", "-n", ns, "link", "add", "kairon0", "type", "bridge")
	run("ip", "-n", ns, "tuntap", "add", "kt0123456789", "mode", "tap")
	run("ip", "-n", ns, "link", "add", "keep0", "type", "bridge")
	for _, table := range []string{"bridge kairon", "inet kairon", "bridge kairon_egress", "inet kairon_egress"} {
		run(append([]string{"ip", "netns", "exec", ns, "nft", "add", "table"}, strings.Fields(table)...)...)
	}
	dataDir := t.TempDir()
	if err := recordGuestNetwork(dataDir, ns); err != nil {
		t.Fatal(err)
	}

	// An agent of another kairon-local in the namespace: nothing goes.
	fake := filepath.Join(t.TempDir(), "kairon-node")
	if err := os.Link("/bin/sleep", fake); err != nil {
		data, err := os.ReadFile("/bin/sleep")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(fake, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	agent := exec.Command("ip", "netns", "exec", ns, fake, "300")
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = agent.Process.Kill(); _ = agent.Wait() })
	// ip netns exec enters the namespace, then execs the agent.
	testenv.Eventually(t, time.Minute, "the fake agent to run in "+ns, func() (bool, string) {
		argv := readArgv(agent.Process.Pid)
		return len(argv) > 0 && argv[0] == fake, strings.Join(argv, " ")
	})
	var out bytes.Buffer
	if err := purgeGuestNetwork(dataDir, &out); err != nil {
		t.Fatal(err)
	}
	if want := "leaving the guest network (bridge kairon0, its taps, nftables tables kairon and kairon_egress) in network namespace " + ns; !strings.Contains(out.String(), want) {
		t.Fatalf("with an agent in the namespace: %q, want %q", out.String(), want)
	}
	if !strings.Contains(out.String(), "kairon-node pid") {
		t.Errorf("the message does not name the agent: %q", out.String())
	}
	if links := run("ip", "-n", ns, "-o", "link", "show"); !strings.Contains(links, "kairon0") || !strings.Contains(links, "kt0123456789") {
		t.Errorf("links removed while an agent runs:\n%s", links)
	}

	_ = agent.Process.Kill()
	_ = agent.Wait()
	out.Reset()
	if err := purgeGuestNetwork(dataDir, &out); err != nil {
		t.Fatal(err)
	}
	if want := "removed the guest network in network namespace " + ns + ": 2 links"; !strings.Contains(out.String(), want) {
		t.Errorf("purge printed %q, want %q", out.String(), want)
	}
	links := run("ip", "-n", ns, "-o", "link", "show")
	if strings.Contains(links, "kairon0") || strings.Contains(links, "kt0123456789") || !strings.Contains(links, "keep0") {
		t.Errorf("after the purge, links:\n%s\nwant kairon0 and the tap gone, keep0 kept", links)
	}
	if tables := run("ip", "netns", "exec", ns, "nft", "list", "tables"); strings.Contains(tables, "kairon") {
		t.Errorf("after the purge, tables:\n%s", tables)
	}

	// Nothing recorded (sim nodes, or none): nothing to do, nothing said.
	out.Reset()
	if err := purgeGuestNetwork(t.TempDir(), &out); err != nil || out.Len() != 0 {
		t.Errorf("without a record: %v %q", err, out.String())
	}
}
