package controller

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// A Machine the claim is Bound to is never handed back to its pool, even by
// a caller that took it for a stray: the claim reconciler may have recorded
// the bind (a status write that looked lost) while the binder was undoing
// it, and handing it back let another claim take it (a double bind seen
// under contention).
func TestReturnToPoolKeepsTheMachineTheClaimIsBoundTo(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	pool := createPool(t, env, ns, "agents", 0)
	claim := &kaironv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "job"}, Spec: kaironv1.MachineClaimSpec{PoolName: "agents"}}
	if err := env.Client.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	held := func(name string) *kaironv1.Machine {
		m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{
			kaironv1.LabelMachinePool: "agents", kaironv1.LabelMachineClaim: "job", kaironv1.LabelPoolState: kaironv1.PoolStateClaimed,
		}}}
		if err := env.Client.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	bound, stray := held("bound"), held("stray")
	claim.Status = kaironv1.MachineClaimStatus{Phase: kaironv1.ClaimBound, MachineName: bound.Name}
	if err := env.Client.Status().Update(ctx, claim); err != nil {
		t.Fatal(err)
	}
	recorder := events.NewFakeRecorder(10)
	for _, m := range []*kaironv1.Machine{bound, stray} {
		if err := returnToPool(ctx, env.Client, env.Client, recorder, pool, claim, m.Name); err != nil {
			t.Fatalf("returning %s: %v", m.Name, err)
		}
	}
	state := func(m *kaironv1.Machine) string {
		got := &kaironv1.Machine{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), got); err != nil {
			t.Fatal(err)
		}
		return got.Labels[kaironv1.LabelPoolState] + "/" + got.Labels[kaironv1.LabelMachineClaim]
	}
	if got := state(bound); got != kaironv1.PoolStateClaimed+"/job" {
		t.Errorf("the Machine the claim is Bound to: %s, want it kept claimed by job", got)
	}
	if got := state(stray); got != kaironv1.PoolStateWarm+"/" {
		t.Errorf("the stray: %s, want it back to warm", got)
	}
}
