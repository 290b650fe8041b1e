package confinement_test

import (
	"context"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/controlplane"
	"github.com/zyvor/kairon/internal/testenv"
)

// TestServiceAccountAgentConfinedToItsNode is the chart's path: the agent
// runs as the kairon-node ServiceAccount in a Pod on node A, and the API
// server puts A in its token (user extra authentication.kubernetes.io/
// node-name). With that token it is refused node B's Node, Machines and
// migrations, and allowed its own. A token of the same account that is not
// bound to a Pod names no node and may write nothing.
func TestServiceAccountAgentConfinedToItsNode(t *testing.T) {
	cp := controlPlane(t)
	ctx := context.Background()
	adm := admin(t, cp)
	cs := kubernetes.NewForConfigOrDie(cp.RESTConfig())
	system := makeNamespace(t, adm)
	saUser := "system:serviceaccount:" + system + ":kairon-node"

	// What the chart installs: the policies with its ServiceAccount's name,
	// and the agents' ClusterRole bound to that account.
	for name, file := range controlplane.Policies {
		if !strings.HasPrefix(name, "kairon-node-confinement") {
			continue
		}
		spec, err := controlplane.ReadPolicy(file, saUser)
		if err != nil {
			t.Fatal(err)
		}
		policy := &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: system + "-" + name}, Spec: *spec}
		binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
			ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
				PolicyName: policy.Name, ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			},
		}
		if err := adm.Create(ctx, policy); err != nil {
			t.Fatal(err)
		}
		if err := adm.Create(ctx, binding); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = adm.Delete(context.Background(), binding); _ = adm.Delete(context.Background(), policy) })
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: system, Name: "kairon-node"}}
	if err := adm.Create(ctx, sa); err != nil {
		t.Fatal(err)
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: system + "-kairon-node"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: controlplane.NodeClusterRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: system, Name: sa.Name}},
	}
	if err := adm.Create(ctx, crb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = adm.Delete(context.Background(), crb) })

	a, b, c := "sa-a", "sa-b", "sa-c"
	nodeA, nodeB := makeNode(t, adm, a), makeNode(t, adm, b)
	makeNode(t, adm, c)
	// The agent's Pod, as the DaemonSet would have it on node A (no kubelet
	// runs it: the token is all that matters).
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: system, Name: "kairon-node-a"},
		Spec:       corev1.PodSpec{NodeName: a, ServiceAccountName: sa.Name, Containers: []corev1.Container{{Name: "kairon-node", Image: "kairon"}}},
	}
	if err := adm.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	bound, err := cs.CoreV1().ServiceAccounts(system).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To[int64](3600),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	unbound, err := cs.CoreV1().ServiceAccounts(system).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To[int64](3600),
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tokenConfig := func(token string) *rest.Config {
		cfg := cp.RESTConfig()
		cfg.TLSClientConfig = rest.TLSClientConfig{CAData: cfg.CAData}
		cfg.BearerToken = token
		return cfg
	}

	// The API server itself says which node the bound token names.
	review, err := kubernetes.NewForConfigOrDie(tokenConfig(bound.Status.Token)).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := review.Status.UserInfo.Extra["authentication.kubernetes.io/node-name"]; len(got) != 1 || got[0] != a {
		t.Fatalf("token bound to a Pod on %s: user %s with extra %v, want node-name [%s]", a, review.Status.UserInfo.Username, review.Status.UserInfo.Extra, a)
	}

	agentA := newClient(t, tokenConfig(bound.Status.Token))
	label := map[string]any{"metadata": map[string]any{"labels": map[string]any{kaironv1.LabelNodeBackend: "qemu"}}}
	ns := makeNamespace(t, adm)
	onA, onB := makeMachine(t, adm, ns, "on-a", a), makeMachine(t, adm, ns, "on-b", b)
	betweenBC := makeMigration(t, adm, ns, "b-to-c", "on-b", b, c)
	finalizer := map[string]any{"metadata": map[string]any{"finalizers": []string{kaironv1.FinalizerMachineVM}}}
	nowhere := newClient(t, tokenConfig(unbound.Status.Token))
	// The policies made just now take effect a moment later, each on its
	// own: wait until the Node, Machine and MachineMigration policies all
	// refuse. The probes are dry runs: admission decides as for the
	// real writes, which the checks below then make.
	testenv.Eventually(t, time.Minute, "the ServiceAccount's policies to be enforced", func() (bool, string) {
		for _, probe := range []struct {
			what, want string
			err        error
		}{
			{"label node B", "may not write Node " + b, dryPatch(ctx, agentA, nodeB, label, false)},
			{"finalizer on a Machine on node B", "may not write Machine on-b", dryPatch(ctx, agentA, onB, finalizer, false)},
			{"fail a migration from B to C", "may not write MachineMigration b-to-c", dryPatch(ctx, agentA, betweenBC, map[string]any{"status": map[string]any{"phase": kaironv1.MigrationFailed}}, true)},
			{"unbound token writes a Machine on A", "credentials name no node", dryPatch(ctx, nowhere, onA, map[string]any{"metadata": map[string]any{"finalizers": nil}}, false)},
		} {
			if probe.err == nil || !strings.Contains(probe.err.Error(), probe.want) {
				return false, probe.what + ": " + errText(probe.err)
			}
		}
		return true, ""
	})

	refused(t, "migration endpoint on its own node", mergePatch(ctx, agentA, nodeA, map[string]any{"metadata": map[string]any{
		"annotations": map[string]any{kaironv1.AnnotationNodeMigrationEndpoint: "10.1.2.3:10251"}}}, false), "kairon-controller owns it")
	refused(t, "finalizer on a Machine on node B", mergePatch(ctx, agentA, onB, finalizer, false), "may not write Machine on-b on node "+b)
	refused(t, "fail a migration from B to C", mergePatch(ctx, agentA, betweenBC, map[string]any{"status": map[string]any{"phase": kaironv1.MigrationFailed}}, true), "may not write MachineMigration b-to-c")
	allowed(t, "label its own node", mergePatch(ctx, agentA, nodeA, label, false))
	allowed(t, "finalizer on its Machine", mergePatch(ctx, agentA, onA, finalizer, false))

	refused(t, "unbound token labels node A", mergePatch(ctx, nowhere, nodeA, label, false), "credentials name no node")
	refused(t, "unbound token writes a Machine on A", mergePatch(ctx, nowhere, onA, map[string]any{"metadata": map[string]any{"finalizers": nil}}, false), "credentials name no node")
}

func errText(err error) string {
	if err == nil {
		return "allowed"
	}
	return err.Error()
}
