package controller

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
	"github.com/zyvor/kairon/internal/testenv"
)

// An attacker with a namespace's credentials fires many hand-placed Machines
// at once, hoping each admission sees the quota as it was before the others.
// Each admitted Machine is charged to the quota before the webhook allows it,
// so no more than the quota's Machines are stored.
func TestMachineWebhookChargesParallelCreatesAtomically(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	node := createNode(t, env, ns, "a", 64, "64Gi")
	ctx := context.Background()
	const limit, attackers = 3, 16
	q := &kaironv1.MachineQuota{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "team"},
		Spec:       kaironv1.MachineQuotaSpec{Hard: kaironv1.MachineResources{Machines: ptr.To[int32](limit)}},
	}
	if err := env.Client.Create(ctx, q); err != nil {
		t.Fatal(err)
	}
	srv := startWebhookControllers(t, env, ns, Options{})
	srv.register(t, env, ns, MachineWebhookPath,
		[]admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}, "machines")

	byHand := func(name string) *kaironv1.Machine {
		m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		m.Spec.NodeName = node.Name
		m.Spec.CPU = 1
		m.Spec.Memory = resource.MustParse("128Mi")
		return m
	}
	// Wait until the API server calls the webhook: a second quota of zero
	// vCPUs refuses even a dry run.
	zero := &kaironv1.MachineQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "zero-cpu-probe"},
		Spec: kaironv1.MachineQuotaSpec{Hard: kaironv1.MachineResources{CPU: ptr.To[int32](0)}}}
	if err := env.Client.Create(ctx, zero); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the webhook to refuse a dry run over a zero cpu quota", func() (bool, string) {
		err := env.Client.Create(ctx, byHand("probe"), client.DryRunAll)
		if err == nil {
			return false, "admitted"
		}
		return apierrors.IsForbidden(err), err.Error()
	})
	if err := env.Client.Delete(ctx, zero); err != nil {
		t.Fatal(err)
	}
	// A dry run within the quota is judged and admitted, and charges nothing.
	eventually(t, "a dry run within the quota to be admitted", func() (bool, string) {
		if err := env.Client.Create(ctx, byHand("probe"), client.DryRunAll); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	var afterDryRun kaironv1.MachineQuota
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(q), &afterDryRun); err != nil {
		t.Fatal(err)
	}
	if c, charged := afterDryRun.Annotations[kaironv1.AnnotationQuotaAdmissionCharges]; charged {
		t.Fatalf("a dry run was charged: %s", c)
	}

	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		admitted []string
		refused  []string
	)
	start := make(chan struct{})
	for i := range attackers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			name := fmt.Sprintf("grab-%02d", i)
			err := env.Client.Create(ctx, byHand(name))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				admitted = append(admitted, name)
			case apierrors.IsForbidden(err) && strings.Contains(err.Error(), `exceeds MachineQuota "team"`),
				apierrors.IsTooManyRequests(err):
				refused = append(refused, name)
			default:
				t.Errorf("creating %s: unexpected error %v", name, err)
			}
		}()
	}
	close(start)
	wg.Wait()

	var stored kaironv1.MachineList
	if err := env.Client.List(ctx, &stored, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(admitted) != limit || len(stored.Items) != limit {
		t.Fatalf("%d parallel Machines against a quota of %d: %d admitted %v, %d stored; want exactly %d",
			attackers, limit, len(admitted), admitted, len(stored.Items), limit)
	}
	if len(refused) != attackers-limit {
		t.Errorf("%d refused, want %d", len(refused), attackers-limit)
	}

	// The charges are settled once the Machines are stored: the next
	// admission drops them, and with room made the quota admits one more.
	if err := env.Client.Delete(ctx, byHand(admitted[0])); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a Machine in the room a deleted one left", func() (bool, string) {
		if err := env.Client.Create(ctx, byHand("after")); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	var got kaironv1.MachineQuota
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(q), &got); err != nil {
		t.Fatal(err)
	}
	charges := rules.ParseAdmissionCharges(&got)
	if len(charges) != 1 || charges[0].Name != "after" {
		t.Errorf("charges after the Machines were stored: %+v, want only the newest (after)", charges)
	}
}
