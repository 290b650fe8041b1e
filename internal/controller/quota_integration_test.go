package controller

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

func createQuota(t *testing.T, env *testenv.Env, ns string, machines int32) *kaironv1.MachineQuota {
	t.Helper()
	q := &kaironv1.MachineQuota{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "team"},
		Spec:       kaironv1.MachineQuotaSpec{Hard: kaironv1.MachineResources{Machines: ptr.To(machines)}},
	}
	if err := env.Client.Create(context.Background(), q); err != nil {
		t.Fatalf("creating quota: %v", err)
	}
	return q
}

func setQuotaMachines(t *testing.T, env *testenv.Env, q *kaironv1.MachineQuota, machines int32) {
	t.Helper()
	patch := client.MergeFrom(q.DeepCopy())
	q.Spec.Hard.Machines = ptr.To(machines)
	if err := env.Client.Patch(context.Background(), q, patch); err != nil {
		t.Fatalf("raising quota: %v", err)
	}
}

// A Machine over quota waits with the quota's numbers in its message, and
// is placed as soon as the quota is raised: the scheduler watches quotas,
// it does not wait for its tick.
func TestQuotaHoldsMachinesPending(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	createNode(t, env, ns, "a", 16, "16Gi")
	quota := createQuota(t, env, ns, 2)
	startControllers(t, env, ns, Options{})

	for _, name := range []string{"m0", "m1", "m2"} {
		createMachine(t, env, ns, name, 1, "256Mi")
	}
	var placed, waiting []string
	eventually(t, "two Machines placed, one over quota", func() (bool, string) {
		placed, waiting = nil, nil
		saw := ""
		for _, m := range listMachines(t, env, ns) {
			saw += describeMachine(&m) + "; "
			c := meta.FindStatusCondition(m.Status.Conditions, kaironv1.ConditionScheduled.String())
			switch {
			case m.Status.Phase == kaironv1.MachineScheduled:
				placed = append(placed, m.Name)
			case m.Status.Phase == kaironv1.MachinePending && c != nil && c.Reason == kaironv1.MachineReasonQuotaExceeded &&
				m.Status.Message == `exceeds MachineQuota "team": machines 2/2 used`:
				waiting = append(waiting, m.Name)
			}
		}
		return len(placed) == 2 && len(waiting) == 1, saw
	})

	eventually(t, "quota status to report use", func() (bool, string) {
		var q kaironv1.MachineQuota
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(quota), &q); err != nil {
			return false, err.Error()
		}
		ready := meta.FindStatusCondition(q.Status.Conditions, kaironv1.ConditionReady.String())
		ok := ptr.Deref(q.Status.Used.Machines, -1) == 2 && ptr.Deref(q.Status.Used.CPU, -1) == 2 &&
			q.Status.Used.Memory != nil && q.Status.Used.Memory.String() == "512Mi" &&
			ptr.Deref(q.Status.Hard.Machines, -1) == 2 &&
			ready != nil && ready.Status == metav1.ConditionTrue && ready.Message == "machines 2/2, cpu 2, memory 512Mi"
		return ok, fmtJSON(q.Status)
	})

	began := time.Now()
	setQuotaMachines(t, env, quota, 3)
	waitScheduled(t, env, ns, waiting[0])
	t.Logf("admitted %s %s after the quota was raised", waiting[0], time.Since(began).Round(time.Millisecond))
}

// With room for one more Machine, the oldest waiting one gets it. The
// scheduler orders by creationTimestamp, which has whole seconds, then by
// name, and the names here go against the order of creation: the Machine
// created first is admitted, unless both got the same second, when the
// name decides. The test takes the timestamps the API server gave; that
// age comes before the name, with timestamps set a second apart, is
// TestSchedulerAdmitsOldestFirst's to show.
func TestQuotaAdmitsOldestFirst(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	createNode(t, env, ns, "a", 16, "16Gi")
	quota := createQuota(t, env, ns, 0)
	startControllers(t, env, ns, Options{})

	older := createMachine(t, env, ns, "z-older", 1, "256Mi")
	younger := createMachine(t, env, ns, "a-younger", 1, "256Mi")
	for _, name := range []string{older.Name, younger.Name} {
		waitPending(t, env, ns, name, kaironv1.MachineReasonQuotaExceeded, `exceeds MachineQuota "team": machines 0/0 used`)
	}
	admitted, left := older.Name, younger.Name
	if older.CreationTimestamp.Equal(&younger.CreationTimestamp) {
		admitted, left = left, admitted
		t.Logf("both created in the second %s: the name decides", older.CreationTimestamp.UTC().Format(time.RFC3339))
	}

	setQuotaMachines(t, env, quota, 1)
	waitScheduled(t, env, ns, admitted)
	waitPending(t, env, ns, left, kaironv1.MachineReasonQuotaExceeded, `exceeds MachineQuota "team": machines 1/1 used`)
}
