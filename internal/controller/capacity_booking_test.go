package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
	"github.com/zyvor/kairon/internal/testenv"
)

func bookingOptions() Options {
	overhead := resource.MustParse("64Mi")
	return Options{CapacityBooking: CapacityBookingOptions{Enabled: true, Overhead: &overhead}}
}

// bookingPods lists the booking pods of ns (of owner only, when given) by
// the node they book, leaving out those being deleted (with no kubelet
// here, a bound pod's deletion never finishes, and its deletion is what a
// test can see).
func bookingPods(t *testing.T, env *testenv.Env, ns string, owner ...*kaironv1.Machine) (live map[string]corev1.Pod, terminating int) {
	t.Helper()
	var pods corev1.PodList
	if err := env.Client.List(context.Background(), &pods, client.InNamespace(ns), client.HasLabels{rules.LabelCapacityBooking}); err != nil {
		t.Fatalf("listing booking pods: %v", err)
	}
	live = map[string]corev1.Pod{}
	for _, p := range pods.Items {
		if len(owner) > 0 && !metav1.IsControlledBy(&p, owner[0]) {
			continue
		}
		if p.DeletionTimestamp != nil {
			terminating++
			continue
		}
		if _, twice := live[p.Spec.NodeName]; twice {
			t.Errorf("two booking pods on node %s: %s and %s", p.Spec.NodeName, live[p.Spec.NodeName].Name, p.Name)
		}
		live[p.Spec.NodeName] = p
	}
	return live, terminating
}

func describePods(pods map[string]corev1.Pod) string {
	var parts []string
	for node, p := range pods {
		c := p.Spec.Containers[0]
		parts = append(parts, fmt.Sprintf("%s on %s (owner %v, cpu %s/%s, memory %s/%s, phase %s)", p.Name, node, p.OwnerReferences,
			c.Resources.Requests.Cpu(), c.Resources.Limits.Cpu(), c.Resources.Requests.Memory(), c.Resources.Limits.Memory(), p.Status.Phase))
	}
	return strings.Join(parts, "; ")
}

// waitBookedOn waits until m's booking pods are exactly one per node in
// nodes, each controlled by m and requesting (and limited to) m's vCPUs and
// memory plus the 64Mi overhead.
func waitBookedOn(t *testing.T, env *testenv.Env, m *kaironv1.Machine, nodes ...string) map[string]corev1.Pod {
	t.Helper()
	var pods map[string]corev1.Pod
	eventually(t, fmt.Sprintf("machine %s booked on %v", m.Name, nodes), func() (bool, string) {
		pods, _ = bookingPods(t, env, m.Namespace, m)
		if len(pods) != len(nodes) {
			return false, describePods(pods)
		}
		wantMemory := rules.MachineMemory(m)
		wantMemory.Add(resource.MustParse("64Mi"))
		for _, node := range nodes {
			p, ok := pods[node]
			if !ok || !rules.IsBookingPod(&p) || len(p.Spec.Containers) != 1 {
				return false, describePods(pods)
			}
			c := p.Spec.Containers[0]
			for _, list := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
				if list.Cpu().Value() != int64(m.Spec.CPU) || list.Memory().Cmp(wantMemory) != 0 {
					return false, describePods(pods)
				}
			}
			if c.Image != DefaultCapacityBookingImage {
				return false, "image " + c.Image
			}
		}
		return true, describePods(pods)
	})
	return pods
}

// A placed Machine gets a booking pod on its node with its size plus the
// overhead; the scheduler does not count that pod on top of the Machine;
// the booking follows a migration to its target before the switch and
// leaves the source after it; a Stopped Machine and a deleted one book
// nothing.
func TestCapacityBookingPods(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	forceDeletePodsAtEnd(t, env, ns)
	onlyA := func(n *corev1.Node) { n.Labels["zone"] = "a" }
	a := createNode(t, env, ns, "a", 4, "3Gi", onlyA)
	b := createNode(t, env, ns, "b", 4, "3Gi")
	opts := bookingOptions()
	opts.NoMigrationController = true // this test plays the migration's phases
	startControllers(t, env, ns, opts)
	inZoneA := func(m *kaironv1.Machine) { m.Spec.NodeSelector = map[string]string{"zone": "a"} }

	createMachine(t, env, ns, "first", 2, "1Gi", inZoneA)
	first := waitScheduled(t, env, ns, "first")
	waitBookedOn(t, env, first, a.Name)

	// Node a has 4 vCPUs and 3Gi: room for the second Machine only if
	// the first one's booking pod (2 vCPUs, 1Gi+64Mi) is not counted
	// beside the Machine itself.
	createMachine(t, env, ns, "second", 2, "1Gi", inZoneA)
	second := waitScheduled(t, env, ns, "second")
	if second.Spec.NodeName != a.Name {
		t.Fatalf("second placed on %s, want %s", second.Spec.NodeName, a.Name)
	}
	waitBookedOn(t, env, second, a.Name)
	// Full now, and the message blames no pods: the booking pods are the
	// Machines themselves.
	createMachine(t, env, ns, "third", 1, "256Mi", inZoneA)
	waitPending(t, env, ns, "third", kaironv1.MachineReasonUnschedulable,
		"0/2 nodes are available: 1 node does not match spec.nodeSelector, 1 node has insufficient cpu (free 0, need 1)")

	// A Running migration of first to b books b before the switch.
	mig := &kaironv1.MachineMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "move-first"},
		Spec:       kaironv1.MachineMigrationSpec{MachineName: first.Name},
	}
	if err := env.Client.Create(context.Background(), mig); err != nil {
		t.Fatalf("creating migration: %v", err)
	}
	mig.Status.Phase = kaironv1.MigrationRunning
	mig.Status.TargetNode = b.Name
	if err := env.Client.Status().Update(context.Background(), mig); err != nil {
		t.Fatalf("setting migration Running: %v", err)
	}
	waitBookedOn(t, env, first, a.Name, b.Name)
	// The switch: first runs on b now, and a's booking goes.
	cur := getMachine(t, env, ns, first.Name)
	moved := cur.DeepCopy()
	moved.Spec.NodeName = b.Name
	if err := env.Client.Patch(context.Background(), moved, client.MergeFrom(cur)); err != nil {
		t.Fatalf("switching first to %s: %v", b.Name, err)
	}
	waitBookedOn(t, env, moved, b.Name)
	// That freed room on a for third, which waited for it.
	waitBookedOn(t, env, waitScheduled(t, env, ns, "third"), a.Name)

	// A Stopped Machine takes no room and books none.
	setMachinePhase(t, env, moved, kaironv1.MachineStopped)
	eventually(t, "first's booking released once it stopped", func() (bool, string) {
		pods, _ := bookingPods(t, env, ns, moved)
		return len(pods) == 0, describePods(pods)
	})
	waitBookedOn(t, env, second, a.Name)

	// A deleted Machine's booking goes with it.
	deleteMachineAsItsAgentWould(t, env, second)
	eventually(t, "second's booking released once it was deleted", func() (bool, string) {
		pods, _ := bookingPods(t, env, ns, second)
		return len(pods) == 0, describePods(pods)
	})
}

// The kubelet rejecting a booking pod (a node fuller than either scheduler
// knew) shows on the Machine: CapacityBooked False with the kubelet's
// reason, and a Warning event.
func TestCapacityBookingRejectedIsReported(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	forceDeletePodsAtEnd(t, env, ns)
	a := createNode(t, env, ns, "a", 4, "4Gi")
	startControllers(t, env, ns, bookingOptions())

	createMachine(t, env, ns, "vm", 1, "1Gi")
	m := waitScheduled(t, env, ns, "vm")
	pod := waitBookedOn(t, env, m, a.Name)[a.Name]

	// What the kubelet writes when its admission finds no room.
	pod.Status.Phase = corev1.PodFailed
	pod.Status.Reason = "OutOfmemory"
	pod.Status.Message = "Pod was rejected: Node didn't have enough resource: memory, requested: 1140850688, used: 3221225472, capacity: 4294967296"
	if err := env.Client.Status().Update(context.Background(), &pod); err != nil {
		t.Fatalf("failing the booking pod: %v", err)
	}
	wantMessage := fmt.Sprintf("node %s rejected booking pod %s: OutOfmemory: %s", a.Name, pod.Name, pod.Status.Message)
	eventually(t, "the Machine to say its booking was rejected", func() (bool, string) {
		m := getMachine(t, env, ns, "vm")
		c := meta.FindStatusCondition(m.Status.Conditions, kaironv1.ConditionCapacityBooked.String())
		if c == nil {
			return false, "no CapacityBooked condition"
		}
		return c.Status == metav1.ConditionFalse && c.Reason == kaironv1.CapacityBookingReasonRejected && c.Message == wantMessage, fmtJSON(c)
	})
	eventually(t, "a Warning event on the Machine", func() (bool, string) {
		notes := machineEvents(t, env, ns, m.Name, corev1.EventTypeWarning, kaironv1.CapacityBookingReasonRejected)
		return len(notes) == 1 && notes[0] == wantMessage, strings.Join(notes, "; ")
	})
	// The rejected pod stays for its reason to be read; no second pod is
	// made beside it meanwhile.
	pods, _ := bookingPods(t, env, ns)
	if len(pods) != 1 || pods[a.Name].UID != pod.UID {
		t.Errorf("booking pods after the rejection: %s", describePods(pods))
	}
}
