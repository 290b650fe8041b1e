package controller

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/node"
	"github.com/zyvor/kairon/internal/rules"
	"github.com/zyvor/kairon/internal/testenv"
)

// setFence puts the fence taint on a node, or takes it off, as kaironctl
// fence and recover do.
func setFence(t *testing.T, env *testenv.Env, name string, fenced bool) {
	t.Helper()
	ctx := context.Background()
	var n corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
		t.Fatal(err)
	}
	updated := n.DeepCopy()
	updated.Spec.Taints = nil
	for _, taint := range n.Spec.Taints {
		if taint.Key != kaironv1.TaintNodeFenced {
			updated.Spec.Taints = append(updated.Spec.Taints, taint)
		}
	}
	if fenced {
		updated.Spec.Taints = append(updated.Spec.Taints, rules.FenceTaint())
	}
	if err := env.Client.Patch(ctx, updated, client.MergeFrom(&n)); err != nil {
		t.Fatal(err)
	}
}

// takeSnapshot creates a MachineSnapshot of machine and waits until it is
// Ready.
func takeSnapshot(t *testing.T, env *testenv.Env, ns, name, machine string) *kaironv1.MachineSnapshot {
	t.Helper()
	s := &kaironv1.MachineSnapshot{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       kaironv1.MachineSnapshotSpec{MachineName: machine},
	}
	if err := env.Client.Create(context.Background(), s); err != nil {
		t.Fatalf("creating snapshot %s: %v", name, err)
	}
	eventually(t, "snapshot "+name+" Ready", func() (bool, string) {
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(s), s); err != nil {
			return false, err.Error()
		}
		return s.Status.Phase == kaironv1.SnapshotReady, string(s.Status.Phase) + ": " + s.Status.Message
	})
	return s
}

// eventReasons are the reasons of the events about the object named name
// in namespace ns ("" for a Node), sorted.
func eventReasons(t *testing.T, env *testenv.Env, ns, kind, name string) []string {
	t.Helper()
	var list eventsv1.EventList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Kind == kind && e.Regarding.Name == name {
			out = append(out, e.Reason)
		}
	}
	sort.Strings(out)
	return out
}

// The fence follows through on a dead node: the MachineSet's Machine and
// the pool's warm members there are deleted (their finalizers finished),
// a claim without a snapshot goes Lost with reason NodeFenced, a claimed
// Machine and a lone Machine with snapshots come back under their names
// from their newest snapshot on the other node (the claim stays Bound), a
// lone Machine without one stays. Nothing new goes to the fenced node.
// Recovered, the restarted agent destroys its stale VMs before its Node is
// Ready and keeps the one whose Machine is still there.
func TestFenceFollowsThrough(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	ctx := context.Background()
	startControllers(t, env, ns, Options{NodeGracePeriod: healthGrace})
	store := t.TempDir()
	shared := func(o *node.Options) {
		o.SnapshotDir = store
		o.SnapshotStore = "fence-" + ns
	}
	a := newHealthAgent(t, env, ns, "a", "10.96.0.0/24", nil, shared)

	createPool(t, env, ns, "agents", 1)
	waitWarm(t, env, ns, "agents", 1, 0)
	createClaim(t, env, ns, "bare", "agents")
	bare := waitClaimBound(t, env, ns, "bare").Status.MachineName
	waitWarm(t, env, ns, "agents", 1, 1)
	createClaim(t, env, ns, "kept", "agents")
	kept := waitClaimBound(t, env, ns, "kept").Status.MachineName
	warmOnA := names(waitWarm(t, env, ns, "agents", 1, 2))
	createMachineSet(t, env, ns, "web", 1)
	waitMachineSet(t, env, ns, "web", 1, 1)
	setOnA := liveMachineNames(t, env, ns, "web")
	for _, name := range []string{"lone", "lone-snap"} {
		createMachine(t, env, ns, name, 1, "64Mi")
		waitPhaseRunning(t, env, ns, name)
	}
	takeSnapshot(t, env, ns, "kept-1", kept)
	newest := takeSnapshot(t, env, ns, "kept-2", kept)
	loneSnap := takeSnapshot(t, env, ns, "lone-snap-1", "lone-snap")
	old := map[string]*kaironv1.Machine{}
	for _, name := range append(append([]string{bare, kept, "lone", "lone-snap"}, warmOnA...), setOnA...) {
		m := getMachine(t, env, ns, name)
		if m.Spec.NodeName != a.node {
			t.Fatalf("machine %s on %q, want every machine on %s", name, m.Spec.NodeName, a.node)
		}
		old[name] = m
	}

	// Node a dies: its agent stops renewing its Lease.
	b := newHealthAgent(t, env, ns, "b", "10.97.0.0/24", nil, shared)
	a.stop()
	eventually(t, "node a Unknown", func() (bool, string) {
		s := nodeCondition(t, env, a.node, corev1.NodeConditionType(kaironv1.NodeConditionAgentReady))
		return s == corev1.ConditionUnknown, string(s)
	})
	setFence(t, env, a.node, true)

	eventually(t, "claim bare Lost, reason NodeFenced", func() (bool, string) {
		c := getClaim(t, env, ns, "bare")
		cond := meta.FindStatusCondition(c.Status.Conditions, kaironv1.ConditionReady.String())
		return c.Status.Phase == kaironv1.ClaimLost && cond != nil && cond.Reason == kaironv1.ClaimReasonNodeFenced &&
			strings.Contains(c.Status.Message, "fenced"), fmtJSON(c.Status)
	})
	for _, name := range append(append([]string{bare}, warmOnA...), setOnA...) {
		eventually(t, "machine "+name+" deleted", func() (bool, string) { return machineGone(t, env, ns, name), name })
	}
	restoredOnB := func(name, snapshot string) {
		t.Helper()
		eventually(t, name+" restored on node b from "+snapshot, func() (bool, string) {
			m := &kaironv1.Machine{}
			if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, m); err != nil {
				return false, err.Error()
			}
			restored := m.Spec.RestoreFrom != nil && m.Spec.RestoreFrom.SnapshotName == snapshot
			return m.UID != old[name].UID && restored && m.Spec.NodeName == b.node && m.Status.Phase == kaironv1.MachineRunning &&
				m.Annotations[kaironv1.AnnotationFencedFrom] == a.node, describeMachine(m)
		})
		if got := eventReasons(t, env, ns, "Machine", name); !slices.Contains(got, kaironv1.EventReasonFenceRestored) {
			t.Errorf("events of %s: %v, want %s", name, got, kaironv1.EventReasonFenceRestored)
		}
	}
	restoredOnB(kept, newest.Name)
	restoredOnB("lone-snap", loneSnap.Name)
	// The claim never went Lost: it is bound to its Machine's new self.
	if c := getClaim(t, env, ns, "kept"); c.Status.Phase != kaironv1.ClaimBound || c.Status.MachineName != kept ||
		c.Annotations[kaironv1.AnnotationFenceRestoring] != "" {
		t.Errorf("claim kept: %s to %s, annotations %v; want Bound to %s", c.Status.Phase, c.Status.MachineName, c.Annotations, kept)
	}
	if m := getMachine(t, env, ns, kept); m.Labels[kaironv1.LabelMachineClaim] != "kept" || len(m.OwnerReferences) == 0 {
		t.Errorf("restored %s lost its claim label or owners: %v %v", kept, m.Labels, m.OwnerReferences)
	}
	// The set and the pool are whole on b.
	waitMachineSet(t, env, ns, "web", 1, 1)
	eventually(t, "one warm member on node b", func() (bool, string) {
		warm, _ := poolMachines(t, env, ns, "agents")
		return len(warm) == 1 && warm[0].Spec.NodeName == b.node && warm[0].Status.Phase == kaironv1.MachineRunning, describeMembers(warm, nil)
	})
	// lone stays, said so.
	if m := getMachine(t, env, ns, "lone"); m.UID != old["lone"].UID || m.Spec.NodeName != a.node || m.DeletionTimestamp != nil {
		t.Errorf("lone: %s; want it left on %s", describeMachine(m), a.node)
	}
	eventually(t, "events on node a and lone", func() (bool, string) {
		n, l := eventReasons(t, env, "", "Node", a.node), eventReasons(t, env, ns, "Machine", "lone")
		return slices.Contains(n, kaironv1.EventReasonNodeFenced) && slices.Contains(l, kaironv1.EventReasonFenceLeft), fmt.Sprint(n, l)
	})
	if got := testutil.ToFloat64(fencedNodes); got != 1 {
		t.Errorf("kairon_fenced_nodes = %v, want 1", got)
	}

	// Recovered: the agent comes back; its Node is Ready only once the VMs
	// of the Machines that left are gone, and lone's VM is still there.
	setFence(t, env, a.node, false)
	eventually(t, "NodeRecovered event and gauge 0", func() (bool, string) {
		n := eventReasons(t, env, "", "Node", a.node)
		return slices.Contains(n, kaironv1.EventReasonNodeRecovered) && testutil.ToFloat64(fencedNodes) == 0, fmt.Sprint(n)
	})
	stale := 0
	instances, err := a.backend.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, inst := range instances {
		if inst.Name != ns+"/lone" {
			stale++
		}
	}
	if stale == 0 {
		t.Fatalf("no stale VM left on node a to test fencing on rejoin: %v", instances)
	}
	// Each VM takes a moment to stop, so that a Ready written before the
	// stale VMs are gone could not go unseen.
	a.opts.Backend = slowStop{a.backend}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	w, err := cs.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + a.node})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	a.start()
	readyAt := time.After(waitTimeout)
	for ready := false; !ready; {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the node watch ended")
			}
			n, isNode := ev.Object.(*corev1.Node)
			ready = isNode && rules.NodeReady(n)
		case <-readyAt:
			t.Fatalf("node a not Ready within %s of its agent's restart", waitTimeout)
		}
	}
	// Read the moment Ready is seen: the stale VMs went first.
	instances, err = a.backend.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, inst := range instances {
		left = append(left, inst.Name)
	}
	if len(left) != 1 || left[0] != ns+"/lone" {
		t.Errorf("node a Ready with VMs %v, want only %s/lone", left, ns)
	}
	waitPhaseRunning(t, env, ns, "lone")
	if got := eventReasons(t, env, "", "Node", a.node); !slices.Contains(got, kaironv1.EventReasonStaleVMDestroyed) {
		t.Errorf("events of node a: %v, want %s", got, kaironv1.EventReasonStaleVMDestroyed)
	}
}

// slowStop is a backend whose VMs take a while to stop.
type slowStop struct{ backend.Backend }

func (s slowStop) Stop(ctx context.Context, id string) error {
	// A deliberate pause, not a wait for a state: the window in which a
	// Ready written too early would show.
	time.Sleep(300 * time.Millisecond)
	return s.Backend.Stop(ctx, id)
}

func waitPhaseRunning(t *testing.T, env *testenv.Env, ns, name string) {
	t.Helper()
	eventually(t, name+" Running", func() (bool, string) {
		m := getMachine(t, env, ns, name)
		return m.Status.Phase == kaironv1.MachineRunning, describeMachine(m)
	})
}
