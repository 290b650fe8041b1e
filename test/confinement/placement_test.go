package confinement_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// TestTenantCannotPlaceMachines: with no admission webhook installed (as in
// kairon-local), a tenant who may create and edit Machines in its namespace
// tries to skip the scheduler, and so its quota and capacity checks: a
// Machine created with spec.nodeName, nodeName set later, a placed Stopped
// Machine started again. Each is refused; clearing nodeName, so that the
// scheduler admits the Machine again, is allowed; so is all of it once the
// tenant is granted the verb place.
func TestTenantCannotPlaceMachines(t *testing.T) {
	cp := controlPlane(t)
	ctx := context.Background()
	adm := admin(t, cp)
	ns := makeNamespace(t, adm)
	node := "place-a"
	makeNode(t, adm, node)
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tenant"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{kaironv1.GroupVersion.Group}, Resources: []string{"machines"},
			Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}}},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tenant"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "tenant"}},
	}
	for _, obj := range []client.Object{role, binding} {
		if err := adm.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	cfg := cp.RESTConfig()
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "tenant", Groups: []string{"system:authenticated"}}
	tenant := newClient(t, cfg)
	newMachine := func(name, nodeName string) *kaironv1.Machine {
		return &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: kaironv1.MachineSpec{NodeName: nodeName, Image: "default"}}
	}
	testenv.Eventually(t, time.Minute, "the tenant's Role to take effect", func() (bool, string) {
		err := tenant.Create(ctx, newMachine("scheduled", ""))
		return err == nil, errText(err)
	})

	refused(t, "create a Machine on a node", tenant.Create(ctx, newMachine("by-hand", node)), "only the scheduler places Machines")
	scheduled := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "scheduled"}}
	refused(t, "set nodeName", mergePatch(ctx, tenant, scheduled, map[string]any{"spec": map[string]any{"nodeName": node}}, false), "only the scheduler places Machines")

	// Placed by the scheduler (the admin here), then stopped: it holds no
	// quota now.
	stopped := makeMachine(t, adm, ns, "stopped", node)
	if err := mergePatch(ctx, adm, stopped, map[string]any{"spec": map[string]any{"powerState": kaironv1.PowerStateStopped}}, false); err != nil {
		t.Fatal(err)
	}
	refused(t, "start a placed Stopped Machine", mergePatch(ctx, tenant, stopped, map[string]any{"spec": map[string]any{"powerState": kaironv1.PowerStateRunning}}, false), "starting it again is admitting it anew")
	allowed(t, "start it through the scheduler", mergePatch(ctx, tenant, stopped, map[string]any{"spec": map[string]any{"powerState": kaironv1.PowerStateRunning, "nodeName": nil}}, false))
	refused(t, "move a placed Machine to another node", mergePatch(ctx, tenant, makeMachine(t, adm, ns, "moved", node), map[string]any{"spec": map[string]any{"nodeName": node + "-other"}}, false), "only the scheduler places Machines")
	allowed(t, "edit a placed Machine otherwise", mergePatch(ctx, tenant, makeMachine(t, adm, ns, "placed", node), map[string]any{"metadata": map[string]any{"labels": map[string]any{"app": "x"}}}, false))

	// The verb place is what the scheduler has; granted, the same requests pass.
	role.Rules = append(role.Rules, rbacv1.PolicyRule{APIGroups: []string{kaironv1.GroupVersion.Group}, Resources: []string{"machines"}, Verbs: []string{"place"}})
	if err := adm.Update(ctx, role); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "a tenant with the verb place to place a Machine", func() (bool, string) {
		err := tenant.Create(ctx, newMachine("by-hand", node))
		return err == nil, errText(err)
	})
}

// TestControllerIdentity: kairon-controller's own certificate can do what
// the controller does (place Machines, write their status, own the Node's
// migration endpoint, record quota charges) and not what it does not.
func TestControllerIdentity(t *testing.T) {
	cp := controlPlane(t)
	ctx := context.Background()
	adm := admin(t, cp)
	ns := makeNamespace(t, adm)
	node := makeNode(t, adm, "ctrl-a")
	ctrl := fromKubeconfig(t, cp.ControllerKubeconfig())

	m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bound"}, Spec: kaironv1.MachineSpec{NodeName: node.Name, Image: "default"}}
	allowed(t, "create a placed Machine", ctrl.Create(ctx, m))
	allowed(t, "write a Machine's status", mergePatch(ctx, ctrl, m, map[string]any{"status": map[string]any{"phase": kaironv1.MachineScheduled}}, true))
	allowed(t, "bind an unplaced Machine", func() error {
		u := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "unplaced"}, Spec: kaironv1.MachineSpec{Image: "default"}}
		if err := ctrl.Create(ctx, u); err != nil {
			return err
		}
		return mergePatch(ctx, ctrl, u, map[string]any{"spec": map[string]any{"nodeName": node.Name}}, false)
	}())
	allowed(t, "write a Node's migration endpoint", mergePatch(ctx, ctrl, node, map[string]any{"metadata": map[string]any{
		"annotations": map[string]any{kaironv1.AnnotationNodeMigrationEndpoint: "10.1.2.3:10251"}}}, false))
	q := &kaironv1.MachineQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "q"}}
	if err := adm.Create(ctx, q); err != nil {
		t.Fatal(err)
	}
	allowed(t, "record a quota's admission charges", mergePatch(ctx, ctrl, q, map[string]any{"metadata": map[string]any{
		"annotations": map[string]any{"kairon.zyvor.dev/admission-charges": "{}"}}}, false))
	allowed(t, "delete a Machine", ctrl.Delete(ctx, m))

	refused(t, "delete a Node", ctrl.Delete(ctx, node), "cannot delete resource")
	refused(t, "create a migration (cordon evacuation is off)", ctrl.Create(ctx, &kaironv1.MachineMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mig"}, Spec: kaironv1.MachineMigrationSpec{MachineName: "unplaced"}}), "cannot create resource")
	refused(t, "read Secrets", ctrl.List(ctx, &corev1.SecretList{}, client.InNamespace(ns)), "cannot list resource")
}
