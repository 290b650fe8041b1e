package controller

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/node"
	"github.com/zyvor/kairon/internal/testenv"
)

// healthGrace is the node grace period of these tests: short, so a dead
// agent shows within seconds, and many times healthRenew.
const (
	healthGrace = 3 * time.Second
	healthRenew = 300 * time.Millisecond
)

// healthAgent is an in-process sim kairon-node that a test can stop (a
// dead agent: its Lease is no longer renewed) and start again over the
// same state, as a restarted agent that finds its VMs still there.
type healthAgent struct {
	t       *testing.T
	env     *testenv.Env
	node    string
	state   string
	backend backend.Backend
	opts    node.Options
	stop    func()
}

func newHealthAgent(t *testing.T, env *testenv.Env, ns, name, cidr string, b backend.Backend, mutate ...func(*node.Options)) *healthAgent {
	t.Helper()
	a := &healthAgent{t: t, env: env, node: ns + "-" + name, state: t.TempDir()}
	if b == nil {
		s, err := sim.New(sim.Options{StateDir: filepath.Join(a.state, "instances"), BootDelay: simBootDelay})
		if err != nil {
			t.Fatal(err)
		}
		b = s
	}
	a.backend = b
	a.opts = node.Options{
		NodeName: a.node, Register: true, Backend: b, StateDir: a.state,
		CPU: 8, Memory: resource.MustParse("4Gi"),
		Network:            &node.NetworkOptions{CIDR: netip.MustParsePrefix(cidr), NoLinks: true},
		Interval:           30 * time.Second,
		LeaseRenewInterval: healthRenew,
	}
	for _, f := range mutate {
		f(&a.opts)
	}
	t.Cleanup(func() {
		err := env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: a.node}})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting node %s: %v", a.node, err)
		}
	})
	a.start()
	return a
}

func (a *healthAgent) start() {
	a.t.Helper()
	agent, err := node.New(a.env.Config, a.opts)
	if err != nil {
		a.t.Fatal(err)
	}
	a.stop = testenv.RunInBackground(a.t, "agent "+a.node, agent.Run)
}

// nodeCondition is the status of one of the Node's conditions, "" without it.
func nodeCondition(t *testing.T, env *testenv.Env, name string, typ corev1.NodeConditionType) corev1.ConditionStatus {
	t.Helper()
	var n corev1.Node
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &n); err != nil {
		t.Fatalf("getting node %s: %v", name, err)
	}
	for _, c := range n.Status.Conditions {
		if c.Type == typ {
			return c.Status
		}
	}
	return ""
}

func reachableCondition(conds []metav1.Condition) string {
	c := meta.FindStatusCondition(conds, kaironv1.ConditionNodeReachable.String())
	if c == nil {
		return "-"
	}
	return string(c.Status) + "/" + c.Reason
}

// A node whose agent stops renewing its Lease goes Unknown after the
// grace; its Machines and the claim bound to one of them say
// NodeReachable=False; the pool replaces its warm members there on the
// other node, no claim binds to them and nothing there is deleted; the
// scheduler places nothing there. The agent comes back: all True again.
func TestNodeHealthUnreachableNode(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	ctx := context.Background()
	startControllers(t, env, ns, Options{NodeGracePeriod: healthGrace})
	a := newHealthAgent(t, env, ns, "a", "10.93.0.0/24", nil)

	createPool(t, env, ns, "agents", 2)
	waitWarm(t, env, ns, "agents", 2, 0)
	createClaim(t, env, ns, "held", "agents")
	bound := waitClaimBound(t, env, ns, "held")
	dead := waitWarm(t, env, ns, "agents", 2, 1) // all three on a
	eventually(t, "node a's KaironAgentReady True", func() (bool, string) {
		s := nodeCondition(t, env, a.node, corev1.NodeConditionType(kaironv1.NodeConditionAgentReady))
		return s == corev1.ConditionTrue, string(s)
	})

	createMachineSet(t, env, ns, "web", 1)
	waitMachineSet(t, env, ns, "web", 1, 1)
	setOnA := liveMachineNames(t, env, ns, "web")

	b := newHealthAgent(t, env, ns, "b", "10.94.0.0/24", nil)
	a.stop()

	// Node a: Unknown, on both conditions (its agent registered it).
	eventually(t, "node a Unknown", func() (bool, string) {
		agent := nodeCondition(t, env, a.node, corev1.NodeConditionType(kaironv1.NodeConditionAgentReady))
		ready := nodeCondition(t, env, a.node, corev1.NodeReady)
		return agent == corev1.ConditionUnknown && ready == corev1.ConditionUnknown, fmt.Sprintf("KaironAgentReady=%s Ready=%s", agent, ready)
	})
	// Its Machines, and the claim bound to one.
	onA := append(names(dead), bound.Status.MachineName)
	eventually(t, "NodeReachable=False on node a's machines and on the claim", func() (bool, string) {
		var saw []string
		ok := true
		for _, name := range onA {
			m := getMachine(t, env, ns, name)
			got := reachableCondition(m.Status.Conditions)
			ok = ok && got == "False/"+kaironv1.NodeReachableReasonLeaseExpired
			saw = append(saw, name+"="+got)
		}
		c := getClaim(t, env, ns, "held")
		got := reachableCondition(c.Status.Conditions)
		ok = ok && got == "False/"+kaironv1.NodeReachableReasonLeaseExpired && c.Status.Phase == kaironv1.ClaimBound
		return ok, strings.Join(saw, " ") + " claim=" + got
	})

	// The pool boots two replacements on b; the dead members stay, uncounted.
	eventually(t, "two ready warm members on node b", func() (bool, string) {
		warm, _ := poolMachines(t, env, ns, "agents")
		p := getPool(t, env, ns, "agents")
		onB := 0
		for _, m := range warm {
			if m.Spec.NodeName == b.node && m.Status.Phase == kaironv1.MachineRunning {
				onB++
			}
		}
		return onB == 2 && p.Status.ReadyWarm == 2 && p.Status.Warm == 2, describeMembers(warm, nil) + " " + fmtJSON(p.Status)
	})
	// The MachineSet too: a replacement on b, its Machine on a left alone.
	eventually(t, "machine set replaced its machine on node a", func() (bool, string) {
		var set kaironv1.MachineSet
		_ = env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "web"}, &set)
		var saw []string
		onB := 0
		for _, m := range listMachines(t, env, ns, client.MatchingLabels{kaironv1.LabelMachineSet: "web"}) {
			saw = append(saw, describeMachine(&m))
			if m.Spec.NodeName == b.node && m.Status.Phase == kaironv1.MachineRunning {
				onB++
			}
		}
		return onB == 1 && set.Status.Replicas == 1 && set.Status.ReadyReplicas == 1, strings.Join(saw, "; ") + " " + fmtJSON(set.Status)
	})
	onA = append(onA, setOnA...)
	// A claim binds a member on b, never a dead one.
	createClaim(t, env, ns, "after", "agents")
	after := waitClaimBound(t, env, ns, "after")
	if m := getMachine(t, env, ns, after.Status.MachineName); m.Spec.NodeName != b.node {
		t.Errorf("claim bound %s on %s, want a member on %s", m.Name, m.Spec.NodeName, b.node)
	}
	// Nothing on a was deleted.
	for _, name := range onA {
		if m := getMachine(t, env, ns, name); m.DeletionTimestamp != nil {
			t.Errorf("machine %s on the unreachable node is being deleted", name)
		}
	}
	// Nothing new goes to a.
	createMachine(t, env, ns, "plain", 1, "64Mi", func(m *kaironv1.Machine) {
		m.Spec.NodeSelector = map[string]string{corev1.LabelHostname: a.node}
	})
	// Under Helm Ready stays the kubelet's and the scheduler says "agent is
	// unreachable" (rules tests); here the agent registered the Node, so
	// its Ready is Unknown too and that comes first.
	eventually(t, "plain to stay Pending, node a unreachable", func() (bool, string) {
		m := getMachine(t, env, ns, "plain")
		return m.Spec.NodeName == "" && strings.Contains(m.Status.Message, "1 node is not ready"), describeMachine(m)
	})

	// The agent comes back: True again.
	a.start()
	eventually(t, "node a reachable again", func() (bool, string) {
		agent := nodeCondition(t, env, a.node, corev1.NodeConditionType(kaironv1.NodeConditionAgentReady))
		ready := nodeCondition(t, env, a.node, corev1.NodeReady)
		return agent == corev1.ConditionTrue && ready == corev1.ConditionTrue, fmt.Sprintf("KaironAgentReady=%s Ready=%s", agent, ready)
	})
	eventually(t, "the claim's machine reachable again", func() (bool, string) {
		m := getMachine(t, env, ns, bound.Status.MachineName)
		c := getClaim(t, env, ns, "held")
		mc, cc := reachableCondition(m.Status.Conditions), reachableCondition(c.Status.Conditions)
		want := "True/" + kaironv1.NodeReachableReasonLeaseRenewed
		return mc == want && cc == want, "machine " + mc + " claim " + cc
	})
	eventually(t, "plain placed on node a", func() (bool, string) {
		m := getMachine(t, env, ns, "plain")
		return m.Spec.NodeName == a.node, describeMachine(m)
	})
	// The pool is back to two warm members (the surplus scaled down).
	eventually(t, "pool back to two warm members", func() (bool, string) {
		warm, _ := poolMachines(t, env, ns, "agents")
		p := getPool(t, env, ns, "agents")
		return len(warm) == 2 && p.Status.ReadyWarm == 2, describeMembers(warm, nil)
	})
	eventually(t, "machine set back to one machine", func() (bool, string) {
		live := liveMachineNames(t, env, ns, "web")
		return len(live) == 1, strings.Join(live, ",")
	})
	// The agent's Lease is where the docs say, held by its node.
	var lease coordinationv1.Lease
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "kube-node-lease", Name: "kairon-" + a.node}, &lease); err != nil {
		t.Errorf("agent lease: %v", err)
	} else if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != a.node {
		t.Errorf("agent lease held by %v, want %s", lease.Spec.HolderIdentity, a.node)
	}
}

// A warm member whose VM dies is Failed: the pool stops counting it,
// boots a replacement and deletes it, saying why.
func TestFailedMembersReplaced(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	startControllers(t, env, ns, Options{NodeGracePeriod: healthGrace})
	a := newHealthAgent(t, env, ns, "a", "10.95.0.0/24", nil)
	simb := a.backend.(*sim.Backend)

	createPool(t, env, ns, "agents", 2)
	warm := waitWarm(t, env, ns, "agents", 2, 0)
	victim := warm[0]
	if err := simb.Crash(ns+"_"+victim.Name, "test: the VM died"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "failed member deleted and replaced", func() (bool, string) {
		w, _ := poolMachines(t, env, ns, "agents")
		p := getPool(t, env, ns, "agents")
		gone := machineGone(t, env, ns, victim.Name)
		return gone && len(w) == 2 && p.Status.ReadyWarm == 2 && !contains(names(w), victim.Name), describeMembers(w, nil)
	})

	createMachineSet(t, env, ns, "web", 2)
	waitMachineSet(t, env, ns, "web", 2, 2)
	before := liveMachineNames(t, env, ns, "web")
	if err := simb.Crash(ns+"_"+before[0], "test: the VM died"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "machine set replaced its failed machine", func() (bool, string) {
		now := liveMachineNames(t, env, ns, "web")
		var set kaironv1.MachineSet
		_ = env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "web"}, &set)
		return !contains(now, before[0]) && len(now) == 2 && set.Status.ReadyReplicas == 2, strings.Join(now, ",") + " " + fmtJSON(set.Status)
	})
}

// A VM that does not reach Running within the boot timeout fails the
// Machine (BootTimeout), and a MachineSet replaces it.
func TestBootTimeoutFailsMachine(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	startControllers(t, env, ns, Options{NodeGracePeriod: healthGrace})
	state := t.TempDir()
	slow, err := sim.New(sim.Options{StateDir: filepath.Join(state, "instances"), BootDelay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	newHealthAgent(t, env, ns, "slow", "10.96.0.0/24", slow, func(o *node.Options) { o.BootTimeout = 2 * time.Second })
	createMachine(t, env, ns, "stuck", 1, "64Mi")
	eventually(t, "stuck to fail with BootTimeout", func() (bool, string) {
		m := getMachine(t, env, ns, "stuck")
		c := meta.FindStatusCondition(m.Status.Conditions, kaironv1.ConditionReady.String())
		return m.Status.Phase == kaironv1.MachineFailed && c != nil && c.Reason == kaironv1.MachineReasonBootTimeout, describeMachine(m) + " " + m.Status.Message
	})
	if _, err := slow.Get(context.Background(), ns+"_stuck"); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("the timed-out VM is still there: %v", err)
	}
}

// flakyBackend fails its first failures starts with err.
type flakyBackend struct {
	backend.Backend
	mu       sync.Mutex
	failures int
	err      error
	starts   int
}

func (f *flakyBackend) Start(ctx context.Context, spec backend.Spec) (backend.Instance, error) {
	f.mu.Lock()
	f.starts++
	fail := f.starts <= f.failures
	f.mu.Unlock()
	if fail {
		return backend.Instance{}, f.err
	}
	return f.Backend.Start(ctx, spec)
}

func (f *flakyBackend) Starts() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.starts
}

type temporaryError struct{}

func (temporaryError) Error() string   { return "disk busy for now" }
func (temporaryError) Temporary() bool { return true }

// A start that fails for a moment is retried with backoff and the Machine
// runs; one that fails for good fails the Machine at once.
func TestTransientStartErrorRetried(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	startControllers(t, env, ns, Options{NodeGracePeriod: healthGrace})
	state := t.TempDir()
	s, err := sim.New(sim.Options{StateDir: filepath.Join(state, "instances"), BootDelay: simBootDelay})
	if err != nil {
		t.Fatal(err)
	}
	flaky := &flakyBackend{Backend: s, failures: 2, err: fmt.Errorf("creating the disk: %w", temporaryError{})}
	newHealthAgent(t, env, ns, "flaky", "10.97.0.0/24", flaky)
	createMachine(t, env, ns, "retried", 1, "64Mi")
	eventually(t, "retried to run after two failed starts", func() (bool, string) {
		m := getMachine(t, env, ns, "retried")
		return m.Status.Phase == kaironv1.MachineRunning && flaky.Starts() == 3, describeMachine(m) + fmt.Sprintf(" starts=%d %s", flaky.Starts(), m.Status.Message)
	})

	flaky.mu.Lock()
	flaky.failures, flaky.starts, flaky.err = 1, 0, errors.New("no such kernel")
	flaky.mu.Unlock()
	createMachine(t, env, ns, "broken", 1, "64Mi")
	eventually(t, "broken to fail at once", func() (bool, string) {
		m := getMachine(t, env, ns, "broken")
		c := meta.FindStatusCondition(m.Status.Conditions, kaironv1.ConditionReady.String())
		return m.Status.Phase == kaironv1.MachineFailed && c != nil && c.Reason == kaironv1.MachineReasonStartFailed, describeMachine(m)
	})
	if n := flaky.Starts(); n != 1 {
		t.Errorf("a permanent error was tried %d times, want 1", n)
	}
}
