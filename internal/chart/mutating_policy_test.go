package chart

import (
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/zyvor/kairon/internal/controlplane"
)

// The chart installs kairon-local's MutatingAdmissionPolicies from the same
// files, where the API server serves them, and nothing where it does not
// (the controller then adds the claim finalizer itself).
func TestChartMutatingPoliciesMatchConfig(t *testing.T) {
	const mapAPI = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"
	m := render(t, "--api-versions", mapAPI)
	for name, file := range controlplane.MutatingPolicies {
		chartName := testRelease + "-kairon-" + strings.TrimPrefix(name, "kairon-")
		var policy admissionregistrationv1.MutatingAdmissionPolicy
		get(t, m, "MutatingAdmissionPolicy", chartName, &policy)
		want, err := controlplane.ReadMutatingPolicy(file)
		if err != nil {
			t.Fatal(err)
		}
		if !equality.Semantic.DeepEqual(policy.Spec, *want) {
			t.Errorf("MutatingAdmissionPolicy %s differs from config/admission/%s", chartName, file)
		}
		var binding admissionregistrationv1.MutatingAdmissionPolicyBinding
		get(t, m, "MutatingAdmissionPolicyBinding", chartName, &binding)
		if binding.Spec.PolicyName != chartName || binding.Spec.ParamRef != nil || binding.Spec.MatchResources != nil {
			t.Errorf("binding %s: %+v, want policy %s everywhere", chartName, binding.Spec, chartName)
		}
	}
	for _, tt := range []struct {
		why   string
		flags []string
	}{
		{"an API server without MutatingAdmissionPolicy", nil},
		{"admissionPolicies.enabled=false", []string{"--api-versions", mapAPI, "--set", "admissionPolicies.enabled=false"}},
	} {
		for _, k := range render(t, tt.flags...).keys() {
			if strings.HasPrefix(k, "MutatingAdmissionPolicy") {
				t.Errorf("%s rendered for %s", k, tt.why)
			}
		}
	}
}
