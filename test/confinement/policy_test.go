package confinement_test

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/zyvor/kairon/internal/controlplane"
	"github.com/zyvor/kairon/internal/testenv"
)

// TestPoliciesTypeCheck: the API server type-checks each policy's CEL
// against the real schemas (the CRDs' and the Node's); a warning there
// means an expression that would fail at admission time.
func TestPoliciesTypeCheck(t *testing.T) {
	cp := controlPlane(t)
	cs := kubernetes.NewForConfigOrDie(cp.RESTConfig())
	for name := range controlplane.Policies {
		testenv.Eventually(t, time.Minute, "policy "+name+" type-checked", func() (bool, string) {
			p, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(context.Background(), name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			if p.Status.ObservedGeneration != p.Generation || p.Status.TypeChecking == nil {
				return false, "not type-checked yet"
			}
			return true, ""
		})
		p, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range p.Status.TypeChecking.ExpressionWarnings {
			t.Errorf("policy %s, %s: %s", name, w.FieldRef, strings.TrimSpace(w.Warning))
		}
	}
}
