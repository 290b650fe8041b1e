package e2e

import (
	"context"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// bindWriteFloor measures the API server on the very writes a bind makes,
// with no controller running: per unit, a MachineClaim created (through
// the claim admission policies), a Machine's labels merge-patched with its
// resourceVersion (the take) and the claim's status merge-patched (Bound).
// The floor (writeRate) uses ConfigMaps; a Kairon object costs
// the API server more per write (a CustomResource is stored as JSON,
// schema-coerced and validated, CEL rules included), so the ratio against
// this floor says how much of a burst's time is Kairon's own doing, and
// the ratio against the ConfigMap floor stays the verdict.
type bindWriteFloor struct {
	writesPerSec float64
	writeLatency time.Duration
}

func (cb *claimBench) bindWriteFloor() bindWriteFloor {
	t := cb.t
	ctx := context.Background()
	const units, clients = 100, 16
	machines := make([]*kaironv1.Machine, units)
	for i := range machines {
		m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: cb.ns, Name: fmt.Sprintf("floor-%d", i),
			Labels: map[string]string{"kairon-bench": "bind-floor"}}}
		if err := cb.c.Create(ctx, m); err != nil {
			t.Fatalf("bind-shaped floor: creating Machine %s: %v", m.Name, err)
		}
		machines[i] = m
	}
	unit := func(prefix string, i int) {
		claim := &kaironv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: cb.ns, Name: fmt.Sprintf("%s-%d", prefix, i),
			Labels: map[string]string{"kairon-bench": "bind-floor"}}, Spec: kaironv1.MachineClaimSpec{PoolName: "bind-floor"}}
		if err := cb.c.Create(ctx, claim); err != nil {
			t.Error(err)
			return
		}
		m := machines[i%units]
		take := fmt.Sprintf(`{"metadata":{"resourceVersion":%q,"labels":{"kairon-bench-claim":%q}}}`, m.ResourceVersion, claim.Name)
		if err := cb.c.Patch(ctx, m, client.RawPatch(types.MergePatchType, []byte(take))); err != nil {
			t.Error(err)
			return
		}
		bound := fmt.Sprintf(`{"status":{"phase":"Bound","machineName":%q,"bindMillis":1}}`, m.Name)
		if err := cb.c.Status().Patch(ctx, claim, client.RawPatch(types.MergePatchType, []byte(bound))); err != nil {
			t.Error(err)
		}
	}
	// Each unit of a round takes its own Machine (i%units), so the takes
	// do not conflict.
	m := measureWrites("floor", 3, units, 25, clients, unit, cb.dropFloorClaims)
	floor := bindWriteFloor{writesPerSec: m.rate, writeLatency: m.latency}
	rounds, singles := m.rates, m.latencies
	if err := cb.c.DeleteAllOf(ctx, &kaironv1.Machine{}, client.InNamespace(cb.ns), client.MatchingLabels{"kairon-bench": "bind-floor"}); err != nil {
		t.Fatalf("deleting the bind-shaped floor's Machines: %v", err)
	}
	testenv.Eventually(t, 2*time.Minute, "the bind-shaped floor's Machines gone", func() (bool, string) {
		var left kaironv1.MachineList
		if err := cb.c.List(ctx, &left, client.InNamespace(cb.ns), client.MatchingLabels{"kairon-bench": "bind-floor"}); err != nil {
			return false, err.Error()
		}
		return len(left.Items) == 0, fmt.Sprintf("%d left", len(left.Items))
	})
	t.Logf("API server writes, the bind's own (claim create, Machine label patch, claim status patch): %.0f writes/s from %d clients, the fastest of %d rounds of %d writes (%s/s); one client: %.2f ms per write, the fastest of %s ms",
		floor.writesPerSec, clients, writeRateRounds, 3*units, strings.Join(rounds, ", "), ms(floor.writeLatency), strings.Join(singles, ", "))
	return floor
}

// dropFloorClaims deletes the floor's claims, taking off the finalizer
// the claim-finalizer admission policy put on them (no controller runs to
// do it), and waits until they are gone.
func (cb *claimBench) dropFloorClaims() {
	t := cb.t
	ctx := context.Background()
	var claims kaironv1.MachineClaimList
	if err := cb.c.List(ctx, &claims, client.InNamespace(cb.ns), client.MatchingLabels{"kairon-bench": "bind-floor"}); err != nil {
		t.Fatalf("listing the bind-shaped floor's claims: %v", err)
	}
	for i := range claims.Items {
		c := &claims.Items[i]
		if err := cb.c.Patch(ctx, c, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))); err != nil {
			t.Fatalf("clearing the finalizer of claim %s: %v", c.Name, err)
		}
		if err := cb.c.Delete(ctx, c); client.IgnoreNotFound(err) != nil {
			t.Fatalf("deleting claim %s: %v", c.Name, err)
		}
	}
	testenv.Eventually(t, 2*time.Minute, "the bind-shaped floor's claims gone", func() (bool, string) {
		var left kaironv1.MachineClaimList
		if err := cb.c.List(ctx, &left, client.InNamespace(cb.ns), client.MatchingLabels{"kairon-bench": "bind-floor"}); err != nil {
			return false, err.Error()
		}
		return len(left.Items) == 0, fmt.Sprintf("%d left", len(left.Items))
	})
}
