package kaironctl_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// On a machine whose clock the API server's claim-creation-stamp policy
// rules out, kaironctl claim still creates the claim, without the stamp,
// and says why. A policy in the test's namespace that refuses every stamp
// stands in for the clock being off.
func TestClaimWithoutAStampTheAPIServerRefuses(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	claimPool(t, env, ns)
	name := "refuse-stamps-" + ns
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{kaironv1.GroupVersion.Group}, APIVersions: []string{"*"}, Resources: []string{"machineclaims"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{
				Expression: `!('` + kaironv1.AnnotationClaimCreatedAt + `' in object.metadata.?annotations.orValue({}))`,
				Message:    "metadata.annotations[" + kaironv1.AnnotationClaimCreatedAt + "]: not within a second of the claim's creation",
				Reason:     ptr.To(metav1.StatusReasonInvalid),
			}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}},
		},
	}
	for _, o := range []client.Object{policy, binding} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := env.Client.Delete(context.Background(), o); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("deleting %s: %v", o.GetName(), err)
			}
		})
	}
	testenv.Eventually(t, time.Minute, "the stand-in policy to be in force", func() (bool, string) {
		probe := &kaironv1.MachineClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "probe", Annotations: map[string]string{kaironv1.AnnotationClaimCreatedAt: "2026-12-02T12:00:00.000Z"}},
			Spec:       kaironv1.MachineClaimSpec{PoolName: "agents"},
		}
		err := env.Client.Create(ctx, probe, client.DryRunAll)
		return apierrors.IsInvalid(err), fmt.Sprint(err)
	})

	r := kctl(t, env, "claim", "agents", "-n", ns, "--wait", "0", "--name", "skewed")
	if r.code != 0 || r.stdout != "machineclaim/skewed created\n" {
		t.Fatalf("kaironctl claim: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	if !strings.HasPrefix(r.stderr, "warning: the API server refused this machine's clock for "+kaironv1.AnnotationClaimCreatedAt) {
		t.Errorf("stderr %q, want the warning about the clock", r.stderr)
	}
	c := &kaironv1.MachineClaim{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "skewed"}, c); err != nil {
		t.Fatal(err)
	}
	if stamp, ok := c.Annotations[kaironv1.AnnotationClaimCreatedAt]; ok {
		t.Errorf("the claim carries the refused stamp %q", stamp)
	}
}
