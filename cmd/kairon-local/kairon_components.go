package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/zyvor/kairon/internal/controlplane"
	"github.com/zyvor/kairon/internal/localport"
)

// nodeOptions are the kairon-local flags every agent shares.
type nodeOptions struct {
	backend      string
	acceleration string
	guestDir     string
	netns        string
	cpu          int
	memory       string
	dnsUpstream  string
	// leaseRenew is how often each agent renews its Lease.
	leaseRenew time.Duration
}

// suspendTimeout bounds how long each agent may take to save its VMs when
// kairon-local stops (kairon-node --suspend-timeout).
const suspendTimeout = 2 * time.Minute

// process is a Kairon binary run as a Component, ready once ready() says so.
type process struct {
	name  string
	bin   string
	args  []string
	ready func(ctx context.Context, cp *controlplane.ControlPlane) error
	proc  *controlplane.Process
	// stopGrace is how long Stop waits after SIGTERM before SIGKILL.
	stopGrace time.Duration
	// agent: a node agent, stopped together with the other agents.
	agent bool
	// prepare, when set, runs before the process starts (once the control
	// plane, and so its PKI, is up), at every start.
	prepare func(cp *controlplane.ControlPlane) error
	// node is the node a node agent runs ("" for other components).
	node string
}

func (p *process) Name() string { return p.name }

func (p *process) Start(ctx context.Context, cp *controlplane.ControlPlane) error {
	if _, err := os.Stat(p.bin); err != nil {
		return fmt.Errorf("%s not found: run `make build`", p.bin)
	}
	if p.prepare != nil {
		if err := p.prepare(cp); err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
	}
	proc, err := cp.StartProcess(p.name, p.bin, p.args)
	if err != nil {
		return err
	}
	p.proc = proc
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var last error
	for {
		if proc.Exited() {
			return proc.ExitError()
		}
		if last = p.ready(ctx, cp); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			proc.Stop(5 * time.Second)
			return fmt.Errorf("not ready after 2m (%v); see %s", last, proc.LogPath())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (p *process) Done() <-chan error { return p.proc.Done() }

func (p *process) Stop() error {
	if p.proc != nil {
		grace := p.stopGrace
		if grace == 0 {
			grace = 15 * time.Second
		}
		p.proc.Stop(grace)
	}
	return nil
}

func (p *process) stopsWithAgents() bool { return p.agent }

func (p *process) nodeName() string { return p.node }

// controllerComponent runs kairon-controller as itself (its own
// certificate and ClusterRole, not the admin's); it is ready when /readyz
// answers.
func controllerComponent(binDir, dataDir string, grace time.Duration, pprof string) (Component, error) {
	kubeconfig := controlplane.ControllerKubeconfigPath(dataDir)
	probe, err := freeLoopbackAddress()
	if err != nil {
		return nil, err
	}
	args := []string{"-kubeconfig", kubeconfig, "-metrics-bind-address", "127.0.0.1:0", "-health-probe-bind-address", probe,
		"-node-grace-period", grace.String()}
	if pprof != "" {
		args = append(args, "-pprof-bind-address", pprof)
	}
	return &process{
		name: "kairon-controller",
		bin:  filepath.Join(binDir, "kairon-controller"),
		args: args,
		ready: func(ctx context.Context, _ *controlplane.ControlPlane) error {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+probe+"/readyz", nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("/readyz: %s", resp.Status)
			}
			return nil
		},
	}, nil
}

// LocalSnapshotStore is the snapshot store of kairon-local's agents: the
// data dir's snapshots directory, which they all reach.
const LocalSnapshotStore = "kairon-local"

// nodeStateDir is where node's agent keeps its state in dataDir; dataDirOf
// goes back.
func nodeStateDir(dataDir, node string) string { return filepath.Join(dataDir, "nodes", node) }

// dataDirOf is the data dir of an agent's --state-dir, or "" for a state
// dir kairon-local did not make.
func dataDirOf(stateDir string) string {
	if filepath.Base(filepath.Dir(stateDir)) != "nodes" {
		return ""
	}
	return filepath.Dir(filepath.Dir(stateDir))
}

// nodeComponent runs agent number i (1-based) with its own bridge, address
// range, state directory and identity: a certificate that lets it write
// only its own Node, the Machines on it and its migrations. It is ready
// when its Node reports Ready.
func nodeComponent(binDir, dataDir string, i int, o nodeOptions) Component {
	name := "node-" + strconv.Itoa(i)
	kubeconfig := controlplane.NodeKubeconfigPath(dataDir, name)
	// When this run of the agent started: a Ready from an earlier run
	// (before `kairon-local node kill`) does not count. Set by prepare.
	var started time.Time
	args := []string{
		"--kubeconfig", kubeconfig, "--node-name", name, "--register",
		"--backend", o.backend, "--acceleration", o.acceleration,
		"--state-dir", nodeStateDir(dataDir, name),
		"--guest-dir", o.guestDir,
		"--cpu", strconv.Itoa(o.cpu), "--memory", o.memory,
		// One guest network and bridge for all nodes, a pool of addresses
		// each: a guest moved to another node keeps its address and stays
		// reachable.
		"--network-cidr", "10.88.0.0/16", "--address-pool", fmt.Sprintf("10.88.%d.0/24", i), "--bridge", guestBridge,
		"--listen", "127.0.0.1:0",
		// Its own certificate, CN = DNS SAN = its node name: the other
		// agents send it only the guests migrating to it, and take from it
		// only those migrating from it.
		"--migration-listen", "127.0.0.1:0", "--migration-tls-dir", controlplane.MigrationTLSDir(dataDir, name),
		"--client-ca-file", filepath.Join(dataDir, "pki", "ca.crt"),
		// Nothing may outlive kairon-local: on Ctrl-C or SIGTERM each agent
		// saves its VMs into its state dir and stops them, and the next
		// agent restores them.
		"--on-shutdown", "suspend", "--suspend-timeout", suspendTimeout.String(),
		// Egress policies: each agent's DNS and SNI proxies on ports of
		// its own on the shared bridge's address, forwarding to the
		// resolver of --egress-dns-upstream.
		"--egress-dns-port", strconv.Itoa(egressProxyBase + 2*(i-1)), "--egress-sni-port", strconv.Itoa(egressProxyBase + 2*(i-1) + 1),
		"--egress-dns-upstream", o.dnsUpstream,
		// MachineSnapshots on the data dir, which every agent here shares:
		// any node restores any snapshot (docs/guides/snapshots.md).
		"--snapshot-dir", filepath.Join(dataDir, "snapshots"), "--snapshot-store", LocalSnapshotStore,
		"--lease-renew-interval", o.leaseRenew.String(),
	}
	if o.netns != "" {
		args = append(args, "--netns", o.netns)
	}
	return &process{
		name: "kairon-" + name,
		bin:  filepath.Join(binDir, "kairon-node"),
		args: args,
		// Saving the VMs, then marking the Node NotReady.
		stopGrace: suspendTimeout + 30*time.Second,
		agent:     true,
		node:      name,
		prepare: func(cp *controlplane.ControlPlane) error {
			started = time.Now().Add(-time.Second)
			if _, err := cp.NodeKubeconfig(name); err != nil {
				return err
			}
			_, err := controlplane.EnsureMigrationTLS(dataDir, name)
			return err
		},
		ready: func(ctx context.Context, cp *controlplane.ControlPlane) error {
			clients, err := kubernetes.NewForConfig(cp.RESTConfig())
			if err != nil {
				return err
			}
			n, err := clients.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue && c.LastHeartbeatTime.After(started) {
					return nil
				}
			}
			return errors.New("node " + name + " is not Ready yet")
		},
	}
}

// uiComponent runs kairon-ui as kairon-local's admin (the data dir's
// kubeconfig), on 127.0.0.1:port only; it is ready when /healthz answers,
// which it does once its cache holds every kind.
func uiComponent(binDir, dataDir string, port int, allowWrite bool) Component {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	args := []string{"--kubeconfig", filepath.Join(dataDir, "kubeconfig"), "--auth", "kubeconfig", "--listen", addr}
	if allowWrite {
		args = append(args, "--allow-write")
	}
	return &process{
		name: "kairon-ui",
		bin:  filepath.Join(binDir, "kairon-ui"),
		args: args,
		ready: func(ctx context.Context, _ *controlplane.ControlPlane) error {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/healthz", nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("/healthz: %s", resp.Status)
			}
			return nil
		},
	}
}

// uiURL is where kairon-local's kairon-ui answers.
func uiURL(port int) string { return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// egressProxyBase is node-1's DNS proxy port; its SNI proxy has the next,
// node-2 the two after, and so on.
const egressProxyBase = 10153

func freeLoopbackAddress() (string, error) { return localport.FreeAddress() }
