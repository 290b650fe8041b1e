package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/host"
)

// One node of a running kairon-local goes down and comes back while the
// rest runs on: an agent killed (as a host that died) is reported and left
// down, kairon-local does not exit, and the Node goes Unknown after the
// short grace period passed through to kairon-controller; `node start`
// brings it back Ready; `node stop` stops one cleanly. Commands that make
// no sense are refused with the reason.
func TestNodeCommandsTakeOneNodeDownAndBack(t *testing.T) {
	binDir := host.BinDir(t)
	exe := buildKaironLocal(t)
	dataDir := t.TempDir()
	kubeconfig := filepath.Join(dataDir, "kubeconfig")
	up := startUp(t, exe, "--data-dir", dataDir, "--port", "0", "--bin-dir", binDir, "--nodes", "2", "--backend", "sim",
		"--node-grace-period", "4s", "--lease-renew-interval", "1s")
	node := func(args ...string) (string, string, error) {
		cmd := exec.Command(exe, append([]string{"node"}, append(args, "--data-dir", dataDir)...)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String(), stderr.String(), err
	}
	condition := func(name, typ string) string {
		return jsonpath(t, kubeconfig, "node", name, `{.status.conditions[?(@.type=="`+typ+`")].status}`)
	}
	if !strings.Contains(readFile(t, filepath.Join(dataDir, "logs", "kairon-controller.log")), "-node-grace-period 4s") {
		t.Errorf("kairon-controller was not started with -node-grace-period 4s")
	}

	out, errOut, err := node("kill", "node-1")
	if err != nil || !strings.Contains(out, "killed kairon-node-1") {
		t.Fatalf("node kill node-1: %v\nstdout: %s\nstderr: %s", err, out, errOut)
	}
	testenv.Eventually(t, time.Minute, "node-1 KaironAgentReady Unknown", func() (bool, string) {
		s := condition("node-1", "KaironAgentReady")
		return s == "Unknown", s
	})
	if up.hasExited() {
		t.Fatalf("kairon-local exited when an agent was killed:\n%s", up.output())
	}
	if s := condition("node-2", "KaironAgentReady"); s != "True" {
		t.Errorf("node-2's KaironAgentReady is %q while node-1 is down, want True", s)
	}
	if _, errOut, err := node("kill", "node-1"); err == nil || !strings.Contains(errOut, "the agent of node node-1 is not running") {
		t.Errorf("a second node kill node-1: %v, stderr %q; want it refused", err, errOut)
	}
	if _, errOut, err := node("stop", "node-9"); err == nil || !strings.Contains(errOut, `runs no node "node-9" (its nodes: node-1, node-2)`) {
		t.Errorf("node stop node-9: %v, stderr %q; want it refused, naming the nodes", err, errOut)
	}

	out, errOut, err = node("start", "node-1")
	if err != nil || !strings.Contains(out, "kairon-node-1 runs again; node node-1 is Ready") {
		t.Fatalf("node start node-1: %v\nstdout: %s\nstderr: %s", err, out, errOut)
	}
	testenv.Eventually(t, time.Minute, "node-1 KaironAgentReady True again", func() (bool, string) {
		s := condition("node-1", "KaironAgentReady")
		return s == "True", s
	})
	if _, errOut, err := node("start", "node-1"); err == nil || !strings.Contains(errOut, "the agent of node node-1 is running already") {
		t.Errorf("node start on a running node: %v, stderr %q; want it refused", err, errOut)
	}

	out, errOut, err = node("stop", "node-2")
	if err != nil || !strings.Contains(out, "stopped kairon-node-2") {
		t.Fatalf("node stop node-2: %v\nstdout: %s\nstderr: %s", err, out, errOut)
	}
	if s := condition("node-2", "Ready"); s == "True" {
		t.Errorf("node-2 is Ready after node stop")
	}
	if up.hasExited() {
		t.Fatalf("kairon-local exited when an agent was stopped:\n%s", up.output())
	}
	// Stopped with one node down: the rest stops as usual, nothing is left.
	up.terminate(t, dataDir)
	if _, errOut, err := node("start", "node-2"); err == nil || !strings.Contains(errOut, "no kairon-local up runs on "+dataDir) {
		t.Errorf("node start with no kairon-local: %v, stderr %q", err, errOut)
	}
}

// An agent that dies on its own is reported, with how to bring it back.
func TestUpReportsAnAgentThatDied(t *testing.T) {
	binDir := host.BinDir(t)
	exe := buildKaironLocal(t)
	dataDir := t.TempDir()
	up := startUp(t, exe, "--data-dir", dataDir, "--port", "0", "--bin-dir", binDir, "--nodes", "1", "--backend", "sim")
	pid := agentPIDIn(t, dataDir, "node-1")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "kairon-local to report the agent's death", func() (bool, string) {
		return strings.Contains(up.output(), "start it again with 'kairon-local node start node-1'"), up.output()
	})
	if up.hasExited() {
		t.Fatalf("kairon-local exited when its agent died:\n%s", up.output())
	}
	up.terminate(t, dataDir)
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func agentPIDIn(t *testing.T, dataDir, node string) int {
	t.Helper()
	pid := agentPID(dataDir, node)
	if pid == 0 {
		t.Fatalf("no kairon-node of %s in %s", node, dataDir)
	}
	return pid
}
