package chart

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/config/admission"
	"github.com/zyvor/kairon/internal/controlplane"
	"github.com/zyvor/kairon/internal/testenv"
)

// agentPod makes the Pod the DaemonSet would run on nodeName under
// ServiceAccount sa (no kubelet runs it) and returns the reference to bind
// the agent's token to.
func agentPod(t *testing.T, env *testenv.Env, ns, sa, nodeName string) *authenticationv1.BoundObjectReference {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kairon-node-" + nodeName},
		Spec: corev1.PodSpec{NodeName: nodeName, ServiceAccountName: sa,
			Containers: []corev1.Container{{Name: "kairon-node", Image: "kairon"}}},
	}
	if err := env.Client.Create(context.Background(), pod); err != nil {
		t.Fatalf("the agent's Pod on %s: %v", nodeName, err)
	}
	return &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
}

// TestAccessFilesMatchConfig: the chart's copies of the RBAC rules and
// admission policies are config/rbac and config/admission, byte for byte,
// which kairon-local installs: one source for both.
func TestAccessFilesMatchConfig(t *testing.T) {
	root := repoRoot(t)
	for _, dir := range []string{"rbac", "admission"} {
		want := readYAMLDir(t, filepath.Join(root, "config", dir))
		have := readYAMLDir(t, filepath.Join(root, "charts", "kairon", "files", dir))
		if len(want) == 0 {
			t.Fatalf("config/%s holds no YAML", dir)
		}
		for name, data := range want {
			if got, ok := have[name]; !ok || !bytes.Equal(got, data) {
				t.Errorf("charts/kairon/files/%s/%s is missing or differs from config/%s/%s: run `make generate`", dir, name, dir, name)
			}
		}
		for name := range have {
			if _, ok := want[name]; !ok {
				t.Errorf("charts/kairon/files/%s/%s has no config/%s/%s: delete it", dir, name, dir, name)
			}
		}
	}
}

// TestTemplateAccess: the chart renders the agents' and the controller's
// ClusterRoles with exactly the shared rules, and the four policies, each
// bound with Deny, with the node agents' ServiceAccount in place of the
// placeholder; admissionPolicies.enabled=false renders none.
func TestTemplateAccess(t *testing.T) {
	// Booking pods add pod rights to the controller's role, on top of the
	// shared rules (TestControllerRBAC).
	m := render(t, "--set", "controller.capacityBooking.enabled=false")
	for name, file := range map[string]string{nodeAgentName: "node-agent.yaml", controllerName: "controller.yaml", testRelease + "-kairon-console-reader": "console-reader.yaml", testRelease + "-kairon-guest-user": "guest-user.yaml"} {
		var role rbacv1.ClusterRole
		get(t, m, "ClusterRole", name, &role)
		want, err := controlplane.ReadRules(file)
		if err != nil {
			t.Fatal(err)
		}
		if !equality.Semantic.DeepEqual(role.Rules, want) {
			t.Errorf("ClusterRole %s: rules\n%v\nwant config/rbac/%s:\n%v", name, role.Rules, file, want)
		}
	}
	var reader rbacv1.ClusterRoleBinding
	get(t, m, "ClusterRoleBinding", testRelease+"-kairon-console-reader", &reader)
	if len(reader.Subjects) != 1 || reader.Subjects[0].Kind != rbacv1.UserKind || reader.Subjects[0].Name != "kube-apiserver-kubelet-client" {
		t.Errorf("console reader binding subjects %+v, want the user kube-apiserver-kubelet-client", reader.Subjects)
	}

	sa := "system:serviceaccount:" + testNamespace + ":" + nodeAgentName
	for name, file := range controlplane.Policies {
		chartName := testRelease + "-kairon-" + strings.TrimPrefix(name, "kairon-")
		var policy admissionregistrationv1.ValidatingAdmissionPolicy
		get(t, m, "ValidatingAdmissionPolicy", chartName, &policy)
		want, err := controlplane.ReadPolicy(file, sa)
		if err != nil {
			t.Fatal(err)
		}
		if !equality.Semantic.DeepEqual(policy.Spec, *want) {
			t.Errorf("ValidatingAdmissionPolicy %s differs from config/admission/%s with %s", chartName, file, sa)
		}
		js, _ := yaml.Marshal(policy)
		if bytes.Contains(js, []byte(admission.NodeServiceAccountPlaceholder)) {
			t.Errorf("ValidatingAdmissionPolicy %s still holds %s", chartName, admission.NodeServiceAccountPlaceholder)
		}
		if strings.HasPrefix(name, "kairon-node-confinement") && !bytes.Contains(js, []byte(sa)) {
			t.Errorf("ValidatingAdmissionPolicy %s does not name the agents' ServiceAccount %s", chartName, sa)
		}
		var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
		get(t, m, "ValidatingAdmissionPolicyBinding", chartName, &binding)
		if binding.Spec.PolicyName != chartName || !reflect.DeepEqual(binding.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) ||
			binding.Spec.ParamRef != nil || binding.Spec.MatchResources != nil {
			t.Errorf("binding %s: %+v, want policy %s everywhere with Deny", chartName, binding.Spec, chartName)
		}
	}

	var guest rbacv1.ClusterRole
	get(t, m, "ClusterRole", testRelease+"-kairon-guest-user", &guest)
	if guest.Labels["rbac.authorization.k8s.io/aggregate-to-edit"] != "true" || guest.Labels["rbac.authorization.k8s.io/aggregate-to-admin"] != "true" {
		t.Errorf("guest-user ClusterRole labels %v: want it aggregated into edit and admin", guest.Labels)
	}
	if m.has("ClusterRoleBinding", testRelease+"-kairon-guest-user") {
		t.Error("guest-user is bound by default: the node proxy's identity must not exec in every Machine unless asked")
	}
	proxied := render(t, "--set", "node.guestUser=kube-apiserver-kubelet-client", "--set", "node.guestAccessToEditors=false")
	var guestBinding rbacv1.ClusterRoleBinding
	get(t, proxied, "ClusterRoleBinding", testRelease+"-kairon-guest-user", &guestBinding)
	if len(guestBinding.Subjects) != 1 || guestBinding.Subjects[0].Name != "kube-apiserver-kubelet-client" {
		t.Errorf("guest-user binding subjects %+v, want node.guestUser", guestBinding.Subjects)
	}
	var unaggregated rbacv1.ClusterRole
	get(t, proxied, "ClusterRole", testRelease+"-kairon-guest-user", &unaggregated)
	if _, aggregated := unaggregated.Labels["rbac.authorization.k8s.io/aggregate-to-edit"]; aggregated {
		t.Error("guest-user aggregated into edit with node.guestAccessToEditors=false")
	}

	off := render(t, "--set", "admissionPolicies.enabled=false", "--set", "node.consoleReaderUser=")
	for _, k := range off.keys() {
		if strings.HasPrefix(k, "ValidatingAdmissionPolicy") || k == "ClusterRoleBinding/"+testRelease+"-kairon-console-reader" {
			t.Errorf("%s rendered with admissionPolicies.enabled=false and no node.consoleReaderUser", k)
		}
	}
}

// TestNodeConfinementPoliciesAgree: the three node confinement policies
// (one per resource) must agree on who is an agent and of which node, or
// an agent could be confined on one resource and not on another.
func TestNodeConfinementPoliciesAgree(t *testing.T) {
	var first *admissionregistrationv1.ValidatingAdmissionPolicySpec
	for name, file := range controlplane.Policies {
		if !strings.HasPrefix(name, "kairon-node-confinement") {
			continue
		}
		spec, err := controlplane.ReadPolicy(file, "system:serviceaccount:ns:sa")
		if err != nil {
			t.Fatal(err)
		}
		if spec.FailurePolicy == nil || *spec.FailurePolicy != admissionregistrationv1.Fail {
			t.Errorf("%s: failurePolicy %v, want Fail", file, spec.FailurePolicy)
		}
		if len(spec.Validations) == 0 || spec.Validations[0].Expression != "variables.nodeName != ''" {
			t.Errorf("%s: the first validation must refuse an agent whose credentials name no node", file)
		}
		if first == nil {
			first = spec
			continue
		}
		if !reflect.DeepEqual(spec.MatchConditions, first.MatchConditions) || !reflect.DeepEqual(spec.Variables[0], first.Variables[0]) {
			t.Errorf("%s: match conditions or the nodeName variable differ from the other node confinement policies", file)
		}
	}
}

// TestMachinePolicyCoversTheSpec: an agent may change no field of a
// Machine's spec but nodeName. The policy names the fields one by one (CEL
// cannot compare a spec minus one field), so a field added to MachineSpec
// must be added there too.
func TestMachinePolicyCoversTheSpec(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "config", "admission", "node-confinement-machines.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	st := reflect.TypeOf(kaironv1.MachineSpec{})
	for i := range st.NumField() {
		field := strings.Split(st.Field(i).Tag.Get("json"), ",")[0]
		if field == "nodeName" {
			continue
		}
		if want := "object.spec.?" + field + " == oldObject.spec.?" + field; !bytes.Contains(data, []byte(want)) {
			t.Errorf("config/admission/node-confinement-machines.yaml lacks %q: an agent could change spec.%s", want, field)
		}
	}
}
