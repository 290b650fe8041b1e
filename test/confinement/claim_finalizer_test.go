package confinement_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// The API server puts the claim finalizer on a MachineClaim as it creates
// it (config/admission/claim-finalizer.yaml), once, next to the creator's
// own finalizers, so that the binder has no finalizer to write.
func TestClaimFinalizerIsAddedAtCreation(t *testing.T) {
	cp := controlPlane(t)
	adm := admin(t, cp)
	ns := makeNamespace(t, adm)
	ctx := context.Background()
	claim := func(name string, finalizers ...string) *kaironv1.MachineClaim {
		return &kaironv1.MachineClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Finalizers: finalizers},
			Spec:       kaironv1.MachineClaimSpec{PoolName: "agents"},
		}
	}
	// The API server takes the policy in a moment after it was made.
	testenv.Eventually(t, time.Minute, "a dry-run claim to come back with the claim finalizer", func() (bool, string) {
		c := claim("probe")
		err := adm.Create(ctx, c, client.DryRunAll)
		return err == nil && slices.Contains(c.Finalizers, kaironv1.FinalizerMachineClaim), fmt.Sprintf("%v, finalizers %q", err, c.Finalizers)
	})

	for _, tt := range []struct {
		name  string
		given []string
		want  []string
	}{
		{"none", nil, []string{kaironv1.FinalizerMachineClaim}},
		{"another", []string{"example.com/keep"}, []string{"example.com/keep", kaironv1.FinalizerMachineClaim}},
		{"already", []string{kaironv1.FinalizerMachineClaim}, []string{kaironv1.FinalizerMachineClaim}},
	} {
		c := claim(tt.name, tt.given...)
		if err := adm.Create(ctx, c); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		var got kaironv1.MachineClaim
		if err := adm.Get(ctx, client.ObjectKeyFromObject(c), &got); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.Finalizers, tt.want) {
			t.Errorf("claim created with finalizers %q has %q, want %q", tt.given, got.Finalizers, tt.want)
		}
	}

	// Only at creation: a finalizer the controller removed stays removed.
	var released kaironv1.MachineClaim
	if err := adm.Get(ctx, client.ObjectKey{Namespace: ns, Name: "none"}, &released); err != nil {
		t.Fatal(err)
	}
	released.Finalizers = nil
	if err := adm.Update(ctx, &released); err != nil {
		t.Fatal(err)
	}
	if err := adm.Get(ctx, client.ObjectKeyFromObject(&released), &released); err != nil || len(released.Finalizers) != 0 {
		t.Errorf("after the finalizer was removed the claim has %q (%v), want none", released.Finalizers, err)
	}
	for _, name := range []string{"another", "already"} {
		// The test has no controller to release them.
		c := &kaironv1.MachineClaim{}
		if err := adm.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, c); err == nil {
			c.Finalizers = nil
			_ = adm.Update(ctx, c)
		}
	}
}
