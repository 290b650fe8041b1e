package controller

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// TestPolicyMachinesZeroWithoutAWrite: a policy nobody has written a
// status for reads back with status.machines 0, from the CRD's defaults
// alone, so the MACHINES column shows 0 and PolicyMachinesReconciler has
// nothing to write for it (the write it used to make sat on the path of
// every egress bind).
func TestPolicyMachinesZeroWithoutAWrite(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	p := &kaironv1.MachineNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fresh"},
		Spec:       kaironv1.MachineNetworkPolicySpec{MachineName: "vm"},
	}
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(kaironv1.GroupVersion.WithKind("MachineNetworkPolicy"))
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), u); err != nil {
		t.Fatal(err)
	}
	machines, found, err := unstructured.NestedInt64(u.Object, "status", "machines")
	if err != nil || !found || machines != 0 {
		t.Fatalf("status.machines of a fresh policy: %d (found %v, %v), want 0 read back; status %v", machines, found, err, u.Object["status"])
	}

	r := &PolicyMachinesReconciler{Client: env.Client}
	if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(p)}); err != nil {
		t.Fatal(err)
	}
	after := &kaironv1.MachineNetworkPolicy{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), after); err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != u.GetResourceVersion() {
		t.Fatalf("the reconciler wrote a policy no node reported on (resourceVersion %s → %s)", u.GetResourceVersion(), after.ResourceVersion)
	}
}

// TestPolicyMachinesCorrectsTheCount: when the nodes' entries sum to
// another count than status.machines (two nodes reported at once), the
// reconciler writes the sum and leaves the entries as the nodes wrote them.
func TestPolicyMachinesCorrectsTheCount(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	p := &kaironv1.MachineNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "two-nodes"},
		Spec:       kaironv1.MachineNetworkPolicySpec{MachineName: "vm"},
	}
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	entries := []kaironv1.PolicyEnforcement{
		{Node: "a", Machines: []string{"vm"}, ObservedGeneration: p.Generation},
		{Node: "b", Machines: []string{"vm", "vm-2"}, ObservedGeneration: p.Generation},
	}
	p.Status = kaironv1.MachineNetworkPolicyStatus{Machines: 1, Nodes: entries}
	if err := env.Client.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}

	r := &PolicyMachinesReconciler{Client: env.Client}
	if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(p)}); err != nil {
		t.Fatal(err)
	}
	after := &kaironv1.MachineNetworkPolicy{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), after); err != nil {
		t.Fatal(err)
	}
	if after.Status.Machines != 3 || !equality.Semantic.DeepEqual(after.Status.Nodes, entries) {
		t.Fatalf("status after the reconcile: %s, want machines 3 and the nodes' entries unchanged", fmtJSON(after.Status))
	}
}
