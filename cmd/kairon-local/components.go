package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"

	"github.com/zyvor/kairon/internal/controlplane"
)

// Component is a Kairon process that kairon-local runs on top of a ready
// control plane: the kairon-controller, then one kairon-node agent per
// --nodes. Components start in list order and stop in reverse, so agents
// never outlive the controller and nothing outlives the API server.
type Component interface {
	// Name is how messages refer to the component ("kairon-node-0").
	Name() string
	// Start returns once the component is up. It gets the control plane
	// for its kubeconfig and REST config.
	Start(ctx context.Context, cp *controlplane.ControlPlane) error
	// Done delivers an error if the component stops on its own.
	Done() <-chan error
	// Stop ends the component and waits for it.
	Stop() error
}

// components lists what runs on top of the control plane for these flags:
// kairon-controller, then one agent per --nodes, then kairon-ui (unless
// --ui=false). It is decided before
// anything starts, so a bad request fails in a second rather than after the
// control plane came up.
func components(f upFlags) ([]Component, error) {
	if f.nodes < 0 {
		return nil, fmt.Errorf("--nodes must be 0 or more, not %d", f.nodes)
	}
	if f.nodes > 200 {
		return nil, fmt.Errorf("--nodes %d: at most 200 agents fit the 10.88.N.0/24 ranges", f.nodes)
	}
	switch f.node.backend {
	case "qemu", "sim":
	default:
		return nil, fmt.Errorf("--backend %q: must be qemu or sim", f.node.backend)
	}
	if f.ui && (f.uiPort < 1 || f.uiPort > 65535) {
		return nil, fmt.Errorf("--ui-port %d is not a TCP port", f.uiPort)
	}
	if f.nodeGrace <= 0 {
		return nil, fmt.Errorf("--node-grace-period must be positive, not %s", f.nodeGrace)
	}
	if f.node.leaseRenew <= 0 || f.node.leaseRenew >= f.nodeGrace {
		return nil, fmt.Errorf("--lease-renew-interval %s must be positive and shorter than --node-grace-period %s", f.node.leaseRenew, f.nodeGrace)
	}
	if f.controllerPprof != "" {
		if err := loopbackAddress(f.controllerPprof); err != nil {
			return nil, fmt.Errorf("--controller-pprof-address %q: %v; for example 127.0.0.1:6060 (the profiles are served without authentication)", f.controllerPprof, err)
		}
		if f.nodes == 0 {
			return nil, fmt.Errorf("--controller-pprof-address needs kairon-controller, which --nodes 0 does not run")
		}
	}
	if f.nodes == 0 {
		return nil, nil
	}
	controller, err := controllerComponent(f.binDir, f.dataDir, f.nodeGrace, f.controllerPprof)
	if err != nil {
		return nil, err
	}
	comps := []Component{controller}
	for i := 1; i <= f.nodes; i++ {
		comps = append(comps, nodeComponent(f.binDir, f.dataDir, i, f.node))
	}
	if f.ui {
		// Listening on the port is kairon-ui's to do; taken now, say so
		// before anything starts.
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(f.uiPort)))
		if err != nil {
			return nil, fmt.Errorf("--ui-port %d: %w; pick another port with --ui-port, or run without kairon-ui: --ui=false", f.uiPort, err)
		}
		ln.Close()
		comps = append(comps, uiComponent(f.binDir, f.dataDir, f.uiPort, f.uiAllowWrite))
	}
	return comps, nil
}

// componentSet runs a list of components as one unit. A node agent is the
// exception: one that dies is reported and left down, as a host that died
// would be, and the rest keep running (node_control.go).
type componentSet struct {
	done chan error
	// report is where an agent's death is told.
	report io.Writer

	// ops serializes the node commands (node_control.go) and the shutdown.
	ops     sync.Mutex
	mu      sync.Mutex
	started []Component
	// down are the agents (by node name) that are not running: they died,
	// or `kairon-local node stop/kill` stopped them.
	down map[string]bool
	// killed are the agents `kairon-local node kill` is killing, whose
	// death is no surprise.
	killed map[string]bool
	// stopping: kairon-local is shutting down; no agent starts again.
	stopping bool
}

func newComponentSet(report io.Writer) *componentSet {
	return &componentSet{done: make(chan error, 1), report: report, down: map[string]bool{}, killed: map[string]bool{}}
}

// start starts comps in order. On failure it stops the ones it started.
func (s *componentSet) start(ctx context.Context, cp *controlplane.ControlPlane, comps []Component) error {
	for _, c := range comps {
		if err := c.Start(ctx, cp); err != nil {
			_ = s.stop()
			return fmt.Errorf("starting %s: %w", c.Name(), err)
		}
		s.mu.Lock()
		s.started = append(s.started, c)
		s.mu.Unlock()
		s.watch(c)
	}
	return nil
}

// watch waits for c to stop on its own: an agent is reported and left
// down, anything else ends kairon-local.
func (s *componentSet) watch(c Component) {
	done := c.Done()
	go func() {
		err, ok := <-done
		if !ok || err == nil {
			return
		}
		if node := nodeOf(c); node != "" {
			s.agentDied(node, c, err)
			return
		}
		select {
		case s.done <- fmt.Errorf("%s: %w", c.Name(), err):
		default:
		}
	}()
}

// agentDied records that node's agent is down and says what that means.
func (s *componentSet) agentDied(node string, c Component, err error) {
	s.mu.Lock()
	s.down[node] = true
	killed := s.killed[node]
	delete(s.killed, node)
	stopping := s.stopping
	s.mu.Unlock()
	if killed || stopping {
		return // `node kill` says what it did
	}
	fmt.Fprintf(s.report, "kairon-local: %v\n"+
		"kairon-local: the other components keep running without it. Node %s goes Unknown once its agent's Lease is older than the grace period; its VMs that still run are left as they are.\n"+
		"kairon-local: start it again with 'kairon-local node start %s'; if the node is fenced, run 'kaironctl recover %s' first.\n",
		err, node, node, node)
}

// Done delivers the first failure of a component other than an agent.
func (s *componentSet) Done() <-chan error { return s.done }

// agentStopper is implemented by the node agents, which stop all at once:
// each saves its own VMs, and none needs another meanwhile.
type agentStopper interface{ stopsWithAgents() bool }

// nodeAgent is implemented by the node agents: the node each one runs.
type nodeAgent interface{ nodeName() string }

// nodeOf is the node c runs, or "" if c is not a node agent.
func nodeOf(c Component) string {
	if a, ok := c.(nodeAgent); ok {
		return a.nodeName()
	}
	return ""
}

func isAgent(c Component) bool {
	a, ok := c.(agentStopper)
	return ok && a.stopsWithAgents()
}

// stop stops the started components in reverse order, the agents among them
// together, and returns once all are gone.
func (s *componentSet) stop() error {
	s.ops.Lock()
	defer s.ops.Unlock()
	s.mu.Lock()
	s.stopping = true
	started := s.started
	s.started = nil
	s.mu.Unlock()
	var (
		mu   sync.Mutex
		errs []error
	)
	stopOne := func(c Component) {
		if err := c.Stop(); err != nil {
			mu.Lock()
			errs = append(errs, fmt.Errorf("stopping %s: %w", c.Name(), err))
			mu.Unlock()
		}
	}
	for i := len(started) - 1; i >= 0; {
		if !isAgent(started[i]) {
			stopOne(started[i])
			i--
			continue
		}
		var wg sync.WaitGroup
		for ; i >= 0 && isAgent(started[i]); i-- {
			wg.Add(1)
			go func(c Component) { defer wg.Done(); stopOne(c) }(started[i])
		}
		wg.Wait()
	}
	return errors.Join(errs...)
}

// loopbackAddress checks that address is host:port with a loopback host
// (an IP address or localhost) and a port.
func loopbackAddress(address string) error {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q is not a TCP port", port)
	}
	if host == "localhost" {
		return nil
	}
	if ip, err := netip.ParseAddr(host); err != nil || !ip.IsLoopback() {
		return fmt.Errorf("host %q is not a loopback address", host)
	}
	return nil
}
