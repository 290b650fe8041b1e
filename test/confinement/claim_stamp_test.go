package confinement_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
	"github.com/zyvor/kairon/internal/testenv"
)

// A tenant who wants its claims to look slow (or fast) writes its own
// creation stamp. The API server refuses one that creationTimestamp rules
// out, one that is not a time, and any later change of it.
func TestClaimCreationStampIsChecked(t *testing.T) {
	cp := controlPlane(t)
	adm := admin(t, cp)
	ns := makeNamespace(t, adm)
	ctx := context.Background()
	claim := func(name, stamp string) *kaironv1.MachineClaim {
		c := &kaironv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: kaironv1.MachineClaimSpec{PoolName: "agents"}}
		if stamp != "" {
			c.Annotations = map[string]string{kaironv1.AnnotationClaimCreatedAt: stamp}
		}
		return c
	}
	stamp := func(d time.Duration) string { return time.Now().Add(d).UTC().Format(rules.ClaimStampFormat) }
	invalid := func(what string, err error, want string) {
		t.Helper()
		if err == nil || !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want refused as invalid with %q", what, err, want)
		}
	}

	// The API server takes the policy in a moment after it was made.
	testenv.Eventually(t, time.Minute, "an hour-old stamp to be refused", func() (bool, string) {
		err := adm.Create(ctx, claim("old", stamp(-time.Hour)), client.DryRunAll)
		return err != nil && strings.Contains(err.Error(), "is not within a second of the claim's creation"), fmt.Sprint(err)
	})
	invalid("a stamp an hour ahead", adm.Create(ctx, claim("ahead", stamp(time.Hour))), "is not within a second of the claim's creation")
	invalid("a stamp that is not a time", adm.Create(ctx, claim("word", "yesterday")), `"yesterday" is not an RFC 3339 time`)

	honest := claim("honest", stamp(0))
	if err := adm.Create(ctx, honest); err != nil {
		t.Fatalf("a claim stamped as it is created: %v", err)
	}
	if err := adm.Create(ctx, claim("unstamped", "")); err != nil {
		t.Fatalf("a claim without a stamp: %v", err)
	}
	if _, ok := rules.ClaimCreatedAt(honest); !ok {
		t.Errorf("the controller would not believe the stamp the API server let through: %s at %s", honest.Annotations[kaironv1.AnnotationClaimCreatedAt], honest.CreationTimestamp)
	}

	patch := func(name string, annotations map[string]any) error {
		return mergePatch(ctx, adm, claim(name, ""), map[string]any{"metadata": map[string]any{"annotations": annotations}}, false)
	}
	invalid("changing the stamp", patch("honest", map[string]any{kaironv1.AnnotationClaimCreatedAt: stamp(-time.Hour)}), "cannot be added or changed later")
	invalid("stamping an unstamped claim later", patch("unstamped", map[string]any{kaironv1.AnnotationClaimCreatedAt: stamp(0)}), "cannot be added or changed later")
	if err := patch("honest", map[string]any{"team": "ml"}); err != nil {
		t.Errorf("another annotation on a stamped claim: %v", err)
	}
}
