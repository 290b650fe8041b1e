package controller

import (
	"context"
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/controlplane"
	"github.com/zyvor/kairon/internal/testenv"
)

// The user kairon-local gives a node agent is the one the grants bind.
func TestNodeUserIsKaironLocals(t *testing.T) {
	if nodeUserPrefix != controlplane.NodeUserPrefix {
		t.Errorf("grants bind %q+node, kairon-local issues %q+node", nodeUserPrefix, controlplane.NodeUserPrefix)
	}
}

// asUser is a client of env's API server acting as user (in groups).
func asUser(t *testing.T, env *testenv.Env, user string, groups ...string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// withControllerRules binds kairon-controller's rules
// (config/rbac/controller.yaml) to a user of the test's own and returns
// its config: what that user may do is what the controller may.
func withControllerRules(t *testing.T, env *testenv.Env, ns string) *rest.Config {
	t.Helper()
	rules, err := controlplane.ReadRules("controller.yaml")
	if err != nil {
		t.Fatal(err)
	}
	user := "kairon-test-controller-" + ns
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: rules}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}
	for _, obj := range []client.Object{role, binding} {
		if err := env.Client.Create(context.Background(), obj); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	c := asUser(t, env, user)
	eventually(t, "the controller's rules to take effect", func() (bool, string) {
		err := c.List(context.Background(), &kaironv1.MachineList{}, client.InNamespace(ns))
		return err == nil, fmt.Sprint(err)
	})
	return cfg
}

// A node agent may read a Secret only while a Machine placed on its node
// (or migrating to it) names it in spec.imagePullSecrets for an OCI image:
// not another node's Machine's, not one no Machine names, not one a
// built-in image names; and it loses it when the Machine leaves. The
// grants are made by the controller with its own rules, and read with
// each node's own identity.
func TestNodeAgentsReadOnlyTheirMachinesPullSecrets(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	ctx := context.Background()
	cfg := withControllerRules(t, env, ns)
	env.StartManager(t, cfg, ctrl.Options{
		Cache:      cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
		Controller: testControllerConfig(),
	}, func(mgr ctrl.Manager) error {
		return (&NodePullSecretsReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader()}).SetupWithManager(mgr)
	})

	nodeA, nodeB := ns+"-a", ns+"-b"
	agentA := asUser(t, env, nodeUserPrefix+nodeA, "kairon:nodes")
	agentB := asUser(t, env, nodeUserPrefix+nodeB, "kairon:nodes")
	for _, name := range []string{"pull-a", "pull-b", "pull-a2", "nobodys", "builtin-named"} {
		pullSecret(t, env, ns, name, "registry.example", "u", "p")
	}
	const image = "registry.example/team/app:1@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	machine := func(name, node, image string, secrets ...string) *kaironv1.Machine {
		m := createMachine(t, env, ns, name, 1, "64Mi", func(m *kaironv1.Machine) {
			m.Spec.NodeName, m.Spec.Image = node, image
			for _, s := range secrets {
				m.Spec.ImagePullSecrets = append(m.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: s})
			}
		})
		return m
	}
	get := func(c client.Client, secret string) error {
		return c.Get(ctx, client.ObjectKey{Namespace: ns, Name: secret}, &corev1.Secret{})
	}
	mayRead := func(who string, c client.Client, secret string) {
		t.Helper()
		eventually(t, who+" to read secret "+secret, func() (bool, string) {
			err := get(c, secret)
			return err == nil, fmt.Sprint(err)
		})
	}
	mayNotRead := func(who string, c client.Client, secret string) {
		t.Helper()
		eventually(t, who+" to be refused secret "+secret, func() (bool, string) {
			err := get(c, secret)
			return apierrors.IsForbidden(err), fmt.Sprint(err)
		})
	}
	refusedNow := func(who string, c client.Client, secrets ...string) {
		t.Helper()
		for _, s := range secrets {
			if err := get(c, s); !apierrors.IsForbidden(err) {
				t.Errorf("%s reading secret %s: %v, want Forbidden", who, s, err)
			}
		}
	}

	// Created before the others: once a grant shows them, the
	// controller's cache holds this one too (a watch delivers in order).
	machine("builtin", nodeA, kaironv1.DefaultImage, "builtin-named")
	ma := machine("ma", nodeA, image, "pull-a")
	mb := machine("mb", nodeB, image, "pull-b")
	mayRead("node a", agentA, "pull-a")
	mayRead("node b", agentB, "pull-b")
	refusedNow("node a", agentA, "pull-b", "nobodys", "builtin-named", "pull-a2")
	refusedNow("node b", agentB, "pull-a", "nobodys")
	if err := agentA.List(ctx, &corev1.SecretList{}, client.InNamespace(ns)); !apierrors.IsForbidden(err) {
		t.Errorf("node a listing secrets: %v, want Forbidden", err)
	}
	role := &rbacv1.Role{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: nodePullSecretsRolePrefix + nodeA}, role); err != nil {
		t.Fatal(err)
	}
	if len(role.Rules) != 1 || !slices.Equal(role.Rules[0].ResourceNames, []string{"pull-a"}) || !slices.Equal(role.Rules[0].Verbs, []string{"get"}) ||
		role.Labels[labelNodePullSecrets] != "true" || role.Annotations[annotationPullSecretsNode] != nodeA {
		t.Errorf("node a's role: %s %s", fmtJSON(role.ObjectMeta), fmtJSON(role.Rules))
	}

	// A second Machine on node a adds its secret to the same grant.
	machine("ma2", nodeA, image, "pull-a2", "pull-a")
	mayRead("node a", agentA, "pull-a2")

	// The target of a migration may read the Machine's secrets before
	// the guest arrives, and no longer once it is no target.
	patchMachine(t, env, ma, map[string]any{"metadata": map[string]any{"annotations": map[string]any{kaironv1.AnnotationMachineMigrationTarget: nodeB}}})
	mayRead("node b, the migration's target", agentB, "pull-a")
	patchMachine(t, env, ma, map[string]any{"metadata": map[string]any{"annotations": map[string]any{kaironv1.AnnotationMachineMigrationTarget: nil}}})
	mayNotRead("node b, no longer a target", agentB, "pull-a")

	// A Machine that moves takes its secret along; node b, left with
	// none, loses its grant altogether.
	patchMachine(t, env, mb, map[string]any{"spec": map[string]any{"nodeName": nodeA}})
	mayRead("node a", agentA, "pull-b")
	mayNotRead("node b", agentB, "pull-b")
	grantGone(t, env, ns, nodeB)

	// A grant deleted by hand is made again.
	if err := env.Client.Delete(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: nodePullSecretsRolePrefix + nodeA}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "node a's rolebinding made again", func() (bool, string) {
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: nodePullSecretsRolePrefix + nodeA}, &rbacv1.RoleBinding{})
		return err == nil, fmt.Sprint(err)
	})
	mayRead("node a", agentA, "pull-a")

	// Machines leaving: node a loses what they named, then everything.
	if err := env.Client.Delete(ctx, mb); err != nil {
		t.Fatal(err)
	}
	mayNotRead("node a, after mb left", agentA, "pull-b")
	mayRead("node a, still running ma and ma2", agentA, "pull-a")
	for _, name := range []string{"ma", "ma2"} {
		if err := env.Client.Delete(ctx, &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}); err != nil {
			t.Fatal(err)
		}
	}
	mayNotRead("node a, with no machine naming it", agentA, "pull-a")
	refusedNow("node a", agentA, "pull-a2")
	grantGone(t, env, ns, nodeA)
}

func patchMachine(t *testing.T, env *testenv.Env, m *kaironv1.Machine, body map[string]any) {
	t.Helper()
	if err := env.Client.Patch(context.Background(), m, client.RawPatch("application/merge-patch+json", []byte(fmtJSON(body)))); err != nil {
		t.Fatalf("patching machine %s: %v", m.Name, err)
	}
}

// grantGone waits until node has no grant left in ns.
func grantGone(t *testing.T, env *testenv.Env, ns, node string) {
	t.Helper()
	eventually(t, "node "+node+"'s grant deleted", func() (bool, string) {
		var roles rbacv1.RoleList
		var bindings rbacv1.RoleBindingList
		sel := client.MatchingLabels{labelNodePullSecrets: "true"}
		if err := env.Client.List(context.Background(), &roles, client.InNamespace(ns), sel); err != nil {
			return false, err.Error()
		}
		if err := env.Client.List(context.Background(), &bindings, client.InNamespace(ns), sel); err != nil {
			return false, err.Error()
		}
		var left []string
		for _, r := range roles.Items {
			if r.Annotations[annotationPullSecretsNode] == node {
				left = append(left, "role "+r.Name)
			}
		}
		for _, b := range bindings.Items {
			if b.Annotations[annotationPullSecretsNode] == node {
				left = append(left, "rolebinding "+b.Name)
			}
		}
		return len(left) == 0, fmt.Sprint(left)
	})
}
