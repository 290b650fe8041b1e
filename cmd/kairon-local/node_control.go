package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/zyvor/kairon/internal/controlplane"
)

// A running `kairon-local up` takes commands for one node's agent, so that
// a user can take a node down and bring it back while the rest runs on:
//
//	kairon-local node stop NODE   the agent saves its VMs and stops, as at Ctrl-C
//	kairon-local node kill NODE   SIGKILL to the agent; its VMs run on, unmanaged
//	kairon-local node start NODE  the agent starts again and adopts what it finds
//
// kill is how a dead host looks to the cluster (docs/guides/node-failure.md).
// The commands reach `up` over an HTTP server on a unix socket in the data
// dir, which only the data dir's owner can open.

// controlSocket is the socket of the `up` running on dataDir.
func controlSocket(dataDir string) string { return filepath.Join(dataDir, "control.sock") }

// nodeActions are the commands, as the control socket's paths name them.
var nodeActions = []string{"stop", "kill", "start"}

// serveNodeControl listens on the data dir's control socket until the
// returned func is called. up holds the data dir's lock, so a socket file
// found there is a killed up's leftover.
func serveNodeControl(ctx context.Context, set *componentSet, cp *controlplane.ControlPlane) (func(), error) {
	path := controlSocket(cp.DataDir())
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	// The agents' commands are the admin's: as private as the kubeconfig.
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /nodes/{node}/{action}", func(w http.ResponseWriter, r *http.Request) {
		node, action := r.PathValue("node"), r.PathValue("action")
		var (
			msg string
			err error
		)
		switch action {
		case "stop":
			msg, err = set.stopAgent(node)
		case "kill":
			msg, err = set.killAgent(node, cp.DataDir())
		case "start":
			msg, err = set.startAgent(ctx, cp, node)
		default:
			http.Error(w, fmt.Sprintf("unknown action %q: one of %s", action, strings.Join(nodeActions, ", ")), http.StatusNotFound)
			return
		}
		if err != nil {
			code := http.StatusConflict
			if errors.Is(err, errNoSuchNode) {
				code = http.StatusNotFound
			}
			http.Error(w, err.Error(), code)
			return
		}
		fmt.Fprintln(w, msg)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return func() {
		_ = srv.Close()
		_ = os.Remove(path)
	}, nil
}

var errNoSuchNode = errors.New("no such node")

// agent is node's agent, or an error naming the nodes there are.
func (s *componentSet) agent(node string) (Component, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var nodes []string
	for _, c := range s.started {
		if n := nodeOf(c); n == node {
			return c, nil
		} else if n != "" {
			nodes = append(nodes, n)
		}
	}
	return nil, fmt.Errorf("%w: kairon-local runs no node %q (its nodes: %s)", errNoSuchNode, node, strings.Join(nodes, ", "))
}

// lockNode takes the lock of node commands and checks that kairon-local is
// not stopping and that node's agent runs (or not, by wantDown).
func (s *componentSet) lockNode(node string, wantDown bool) (Component, error) {
	c, err := s.agent(node)
	if err != nil {
		return nil, err
	}
	s.ops.Lock()
	s.mu.Lock()
	stopping, down := s.stopping, s.down[node]
	s.mu.Unlock()
	switch {
	case stopping:
		err = errors.New("kairon-local is stopping")
	case wantDown && !down:
		err = fmt.Errorf("the agent of node %s is running already", node)
	case !wantDown && down:
		err = fmt.Errorf("the agent of node %s is not running; start it with 'kairon-local node start %s'", node, node)
	}
	if err != nil {
		s.ops.Unlock()
		return nil, err
	}
	return c, nil
}

func (s *componentSet) setDown(node string, down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if down {
		s.down[node] = true
	} else {
		delete(s.down, node)
	}
}

func (s *componentSet) isDown(node string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.down[node]
}

// stopAgent stops node's agent as Ctrl-C stops them all: it saves its VMs
// first.
func (s *componentSet) stopAgent(node string) (string, error) {
	c, err := s.lockNode(node, false)
	if err != nil {
		return "", err
	}
	defer s.ops.Unlock()
	began := time.Now()
	err = c.Stop()
	s.setDown(node, true)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("kairon-local: stopped %s in %s; it saved its VMs, which resume at 'kairon-local node start %s'",
		c.Name(), time.Since(began).Round(time.Millisecond), node), nil
}

// killAgent kills node's agent and whatever runs in its process group, but
// not its VMs (each runs in a session of its own): to the cluster, a host
// that died, or was cut off, with its VMs in whatever state they were.
func (s *componentSet) killAgent(node, dataDir string) (string, error) {
	c, err := s.lockNode(node, false)
	if err != nil {
		return "", err
	}
	defer s.ops.Unlock()
	pid := agentPID(dataDir, node)
	if pid == 0 {
		return "", fmt.Errorf("found no kairon-node process of node %s", node)
	}
	s.mu.Lock()
	s.killed[node] = true
	s.mu.Unlock()
	target := pid
	if pgid, err := syscall.Getpgid(pid); err == nil && pgid == pid {
		target = -pid // the agent leads its own group
	}
	if err := syscall.Kill(target, syscall.SIGKILL); err != nil {
		return "", fmt.Errorf("killing %s (pid %d): %w", c.Name(), pid, err)
	}
	deadline := time.Now().Add(time.Minute)
	for !s.isDown(node) {
		if time.Now().After(deadline) {
			return "", fmt.Errorf("%s (pid %d) was sent SIGKILL but kairon-local did not see it end within a minute", c.Name(), pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Reaped: close its log and sweep its group once more.
	_ = c.Stop()
	var vms []string
	if all, err := findVMs(); err == nil {
		for _, vm := range vmsOfNode(all, dataDir, node) {
			vms = append(vms, fmt.Sprintf("%s (pid %d)", vm.Name, vm.PID))
		}
	}
	left := "no VM of it runs"
	if len(vms) > 0 {
		left = "its VMs run on, unmanaged: " + strings.Join(vms, ", ")
	}
	return fmt.Sprintf("kairon-local: killed %s (pid %d); %s. Node %s goes Unknown once its Lease is older than the grace period; "+
		"'kairon-local node start %s' starts the agent again (if the node was fenced, 'kaironctl recover %s' first)",
		c.Name(), pid, left, node, node, node), nil
}

// startAgent starts node's agent again and waits until its Node is Ready,
// as up does. The agent adopts the VMs still running and resumes those it
// saved; on a node that was fenced it first destroys the VMs whose
// Machines run elsewhere now.
func (s *componentSet) startAgent(ctx context.Context, cp *controlplane.ControlPlane, node string) (string, error) {
	c, err := s.lockNode(node, true)
	if err != nil {
		return "", err
	}
	defer s.ops.Unlock()
	began := time.Now()
	if err := c.Start(ctx, cp); err != nil {
		return "", fmt.Errorf("starting %s: %w", c.Name(), err)
	}
	s.setDown(node, false)
	s.watch(c)
	return fmt.Sprintf("kairon-local: %s runs again; node %s is Ready (%s)", c.Name(), node, time.Since(began).Round(100*time.Millisecond)), nil
}

// vmsOfNode are the VMs of one node of dataDir.
func vmsOfNode(vms []vmProcess, dataDir, node string) []vmProcess {
	prefix := filepath.Join(nodeStateDir(dataDir, node), "instances") + "/"
	var out []vmProcess
	for _, vm := range vmsOf(vms, dataDir) {
		if strings.HasPrefix(vm.Dir, prefix) {
			out = append(out, vm)
		}
	}
	return out
}

// agentPID finds the kairon-node of node in dataDir: 0 if none runs.
func agentPID(dataDir, node string) int {
	stateDir := nodeStateDir(dataDir, node)
	found := 0
	_ = eachProcess(func(pid int, argv []string) bool {
		if filepath.Base(argv[0]) != "kairon-node" {
			return false
		}
		if dir, _ := flagValue(argv, "state-dir"); dir == stateDir {
			found = pid
			return true
		}
		return false
	})
	return found
}
