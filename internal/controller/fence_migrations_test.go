package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/controlplane"
	"github.com/zyvor/kairon/internal/testenv"
)

// A fence ends the migrations through the fenced node, run by
// kairon-controller as itself (the ClusterRole of config/rbac/controller.yaml,
// nothing more): a Running one from it and a Running one to it go Failed
// with reason NodeFenced, saying which end was fenced; the dead source
// agent's migration-source finalizer is released, on those and on one that
// had Succeeded; a live source's finalizer stays, and a migration between
// two other nodes is left alone.
func TestFenceEndsMigrationsThroughTheNode(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	ctx := context.Background()
	a := createNode(t, env, ns, "a", 16, "16Gi")
	b := createNode(t, env, ns, "b", 16, "16Gi")
	c := createNode(t, env, ns, "c", 16, "16Gi")

	// Machines and their migrations as the agents left them: Running,
	// nothing switched yet, each source holding its migration.
	migrations := []struct {
		name, machine, source, target string
		phase                         kaironv1.MigrationPhase
	}{
		{"from-a", "leaving", a.Name, b.Name, kaironv1.MigrationRunning},
		{"to-a", "arriving", b.Name, a.Name, kaironv1.MigrationRunning},
		{"done-from-a", "left", a.Name, c.Name, kaironv1.MigrationSucceeded},
		{"b-to-c", "bystander", b.Name, c.Name, kaironv1.MigrationRunning},
	}
	for _, mg := range migrations {
		node := mg.source
		if mg.phase == kaironv1.MigrationSucceeded {
			node = mg.target
		}
		m := createMachine(t, env, ns, mg.machine, 1, "256Mi", func(m *kaironv1.Machine) { m.Spec.NodeName = node })
		setMachinePhase(t, env, m, kaironv1.MachineRunning)
		mig := &kaironv1.MachineMigration{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: mg.name, Finalizers: []string{kaironv1.FinalizerMigrationSource}},
			Spec:       kaironv1.MachineMigrationSpec{MachineName: mg.machine},
		}
		if err := env.Client.Create(ctx, mig); err != nil {
			t.Fatal(err)
		}
		now := metav1.Now()
		mig.Status = kaironv1.MachineMigrationStatus{Phase: mg.phase, Reason: kaironv1.MigrationReasonStarted,
			SourceNode: mg.source, TargetNode: mg.target, StartTime: &now, Message: "moving, as the test says"}
		if mg.phase == kaironv1.MigrationSucceeded {
			mig.Status.Reason, mig.Status.CompletionTime = kaironv1.MigrationReasonSucceeded, &now
		}
		if err := env.Client.Status().Update(ctx, mig); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		// The finalizers left (b's) would keep the namespace.
		var l kaironv1.MachineMigrationList
		_ = env.Client.List(context.Background(), &l, client.InNamespace(ns))
		for i := range l.Items {
			base := l.Items[i].DeepCopy()
			l.Items[i].Finalizers = nil
			_ = env.Client.Patch(context.Background(), &l.Items[i], client.MergeFrom(base))
		}
	})

	startControllers(t, asKaironController(t, env, ns), ns, Options{NodeGracePeriod: healthGrace})
	setFence(t, env, a.Name, true)

	get := func(name string) *kaironv1.MachineMigration {
		return getObject[kaironv1.MachineMigration](t, env, ns, name)
	}
	describe := func(mig *kaironv1.MachineMigration) string {
		return fmt.Sprintf("%s: %s %s %q, finalizers %v", mig.Name, mig.Status.Phase, mig.Status.Reason, mig.Status.Message, mig.Finalizers)
	}
	held := func(mig *kaironv1.MachineMigration) bool {
		return controllerutil.ContainsFinalizer(mig, kaironv1.FinalizerMigrationSource)
	}
	eventually(t, "the migrations through the fenced node ended and released", func() (bool, string) {
		from, to, done := get("from-a"), get("to-a"), get("done-from-a")
		ok := from.Status.Phase == kaironv1.MigrationFailed && from.Status.Reason == kaironv1.MigrationReasonNodeFenced && !held(from) &&
			to.Status.Phase == kaironv1.MigrationFailed && to.Status.Reason == kaironv1.MigrationReasonNodeFenced &&
			!held(done)
		return ok, describe(from) + "; " + describe(to) + "; " + describe(done)
	})
	from, to, done, other := get("from-a"), get("to-a"), get("done-from-a"), get("b-to-c")
	if want := "node " + a.Name + ", the migration's source, was fenced"; !strings.Contains(from.Status.Message, want) {
		t.Errorf("from-a's message %q lacks %q", from.Status.Message, want)
	}
	if want := "node " + a.Name + ", the migration's target, was fenced"; !strings.Contains(to.Status.Message, want) {
		t.Errorf("to-a's message %q lacks %q", to.Status.Message, want)
	}
	if from.Status.CompletionTime == nil || to.Status.CompletionTime == nil {
		t.Errorf("ended without a completion time: %s; %s", describe(from), describe(to))
	}
	if !held(to) {
		t.Errorf("to-a lost the finalizer of its source %s, which is not fenced: %s", b.Name, describe(to))
	}
	if done.Status.Phase != kaironv1.MigrationSucceeded {
		t.Errorf("done-from-a changed its phase: %s", describe(done))
	}
	if other.Status.Phase != kaironv1.MigrationRunning || !held(other) {
		t.Errorf("b-to-c, between two nodes that are not fenced, was touched: %s", describe(other))
	}
	eventually(t, "a NodeFenced event on from-a", func() (bool, string) {
		reasons := eventReasons(t, env, ns, "MachineMigration", "from-a")
		return slices.Contains(reasons, string(kaironv1.MigrationReasonNodeFenced)), fmt.Sprint(reasons)
	})
}

// asKaironController is env as kairon-controller: a user of this test
// bound to the controller's ClusterRole (config/rbac/controller.yaml), as
// kairon-local and the chart bind it, so that what it may not do fails.
func asKaironController(t *testing.T, env *testenv.Env, ns string) *testenv.Env {
	t.Helper()
	ctx := context.Background()
	rules, err := controlplane.ReadRules("controller.yaml")
	if err != nil {
		t.Fatal(err)
	}
	name := "test-kairon-controller-" + ns
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}},
	}
	for _, o := range []client.Object{role, binding} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), o) })
	}
	as := *env
	as.Config = rest.CopyConfig(env.Config)
	as.Config.Impersonate = rest.ImpersonationConfig{UserName: name}
	return &as
}
