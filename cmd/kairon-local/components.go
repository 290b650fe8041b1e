package main

import (
	"context"
	"errors"
	"fmt"
	"net"
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
	if f.nodes == 0 {
		return nil, nil
	}
	controller, err := controllerComponent(f.binDir, f.dataDir)
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

// componentSet runs a list of components as one unit.
type componentSet struct {
	started []Component
	done    chan error
}

func newComponentSet() *componentSet { return &componentSet{done: make(chan error, 1)} }

// start starts comps in order. On failure it stops the ones it started.
func (s *componentSet) start(ctx context.Context, cp *controlplane.ControlPlane, comps []Component) error {
	for _, c := range comps {
		if err := c.Start(ctx, cp); err != nil {
			_ = s.stop()
			return fmt.Errorf("starting %s: %w", c.Name(), err)
		}
		s.started = append(s.started, c)
		go func() {
			if err, ok := <-c.Done(); ok && err != nil {
				select {
				case s.done <- fmt.Errorf("%s: %w", c.Name(), err):
				default:
				}
			}
		}()
	}
	return nil
}

// Done delivers the first component failure.
func (s *componentSet) Done() <-chan error { return s.done }

// agentStopper is implemented by the node agents, which stop all at once:
// each saves its own VMs, and none needs another meanwhile.
type agentStopper interface{ stopsWithAgents() bool }

func isAgent(c Component) bool {
	a, ok := c.(agentStopper)
	return ok && a.stopsWithAgents()
}

// stop stops the started components in reverse order, the agents among them
// together, and returns once all are gone.
func (s *componentSet) stop() error {
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
	for i := len(s.started) - 1; i >= 0; {
		if !isAgent(s.started[i]) {
			stopOne(s.started[i])
			i--
			continue
		}
		var wg sync.WaitGroup
		for ; i >= 0 && isAgent(s.started[i]); i-- {
			wg.Add(1)
			go func(c Component) { defer wg.Done(); stopOne(c) }(s.started[i])
		}
		wg.Wait()
	}
	s.started = nil
	return errors.Join(errs...)
}
