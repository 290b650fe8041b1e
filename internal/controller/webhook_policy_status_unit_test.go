package controller

import (
	"context"
	"errors"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// TestPolicyStatusValidator: a write may add to an entry of status.nodes
// only Machines placed on the entry's node; names already listed are not
// looked up again; a Machine the API server cannot be asked about is
// refused (fail closed). The real API server test is
// test/confinement's TestAgentReportsOnlyItsOwnMachines.
func TestPolicyStatusValidator(t *testing.T) {
	machine := func(name, node string) *kaironv1.Machine {
		return &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Spec: kaironv1.MachineSpec{NodeName: node}}
	}
	gets := 0
	reader := fake.NewClientBuilder().WithScheme(testScheme(t)).
		WithObjects(machine("on-a", "a"), machine("on-a2", "a"), machine("on-b", "b"), machine("unplaced", "")).
		WithInterceptorFuncs(interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			gets++
			if key.Name == "unreadable" {
				return errors.New("connection refused")
			}
			return c.Get(ctx, key, obj, opts...)
		}}).Build()
	v := &PolicyStatusValidator{Reader: reader}
	policy := func(entries ...kaironv1.PolicyEnforcement) *kaironv1.MachineNetworkPolicy {
		return &kaironv1.MachineNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "egress"}, Status: kaironv1.MachineNetworkPolicyStatus{Nodes: entries}}
	}
	entry := func(node string, machines ...string) kaironv1.PolicyEnforcement {
		return kaironv1.PolicyEnforcement{Node: node, Machines: machines, ObservedGeneration: 1}
	}
	for _, c := range []struct {
		what      string
		old, new  *kaironv1.MachineNetworkPolicy
		forbidden string // "" for allowed
		internal  bool
		gets      int
	}{
		{"its own Machine", policy(), policy(entry("a", "on-a")), "", false, 1},
		{"another node's Machine", policy(), policy(entry("a", "on-a", "on-b")), "machine ns/on-b is not, which is placed on node b", false, 2},
		{"a Machine that does not exist", policy(), policy(entry("a", "ghost")), "machine ns/ghost is not, which does not exist", false, 1},
		{"a Machine on no node", policy(), policy(entry("a", "unplaced")), "machine ns/unplaced is not, which is placed on no node", false, 1},
		{"a Machine the API server cannot be asked about", policy(), policy(entry("a", "unreadable")), "", true, 1},
		{"names already listed are not read again", policy(entry("a", "on-a", "moved-away")), policy(entry("a", "on-a", "moved-away", "on-a2")), "", false, 1},
		{"a name listed for another node is new to this one", policy(entry("b", "on-b")), policy(entry("b", "on-b"), entry("a", "on-b")), "placed on node b", false, 1},
		{"dropping names reads nothing", policy(entry("a", "on-a", "on-a2")), policy(entry("a", "on-a")), "", false, 0},
	} {
		gets = 0
		_, err := v.ValidateUpdate(context.Background(), c.old, c.new)
		switch {
		case c.internal:
			if !apierrors.IsInternalError(err) {
				t.Errorf("%s: %v, want an internal error (refused)", c.what, err)
			}
		case c.forbidden == "":
			if err != nil {
				t.Errorf("%s: %v, want allowed", c.what, err)
			}
		case !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), c.forbidden):
			t.Errorf("%s: %v, want 403 saying %q", c.what, err, c.forbidden)
		}
		if gets != c.gets {
			t.Errorf("%s: %d Machine reads, want %d", c.what, gets, c.gets)
		}
	}
}

// TestPolicyStatusWebhookMatchConditions: the webhook's match conditions
// are the node-confinement policy's, with the node agents'
// ServiceAccount in place of the placeholder.
func TestPolicyStatusWebhookMatchConditions(t *testing.T) {
	conditions, err := PolicyStatusWebhookMatchConditions("system:serviceaccount:kairon:kairon-node")
	if err != nil {
		t.Fatal(err)
	}
	if len(conditions) != 1 || conditions[0].Name != "node-agent" {
		t.Fatalf("match conditions %+v, want the policy's node-agent condition", conditions)
	}
	for _, want := range []string{"'system:serviceaccount:kairon:kairon-node'", "'kairon:node:'", "'kairon:nodes'"} {
		if !strings.Contains(conditions[0].Expression, want) {
			t.Errorf("match condition %q does not name %s", conditions[0].Expression, want)
		}
	}
	if strings.Contains(conditions[0].Expression, "KAIRON_NODE_SERVICE_ACCOUNT") {
		t.Errorf("match condition %q keeps the placeholder", conditions[0].Expression)
	}
}
