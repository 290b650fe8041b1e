package controller

import (
	"context"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
	"github.com/zyvor/kairon/internal/testenv"
)

// The real API server calls the MachineMigration webhook over TLS: a
// create the budgets allow goes through, one they do not is refused with
// the budget and its numbers, updates and deletes always go through, and
// without the webhook configuration nothing is refused.
func TestMachineMigrationWebhook(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	node := createNode(t, env, ns, "a", 16, "16Gi")

	// Budgets match across the cluster: a label value unique to the test.
	web := map[string]string{"app": ns}
	for _, name := range []string{"web-1", "web-2", "web-3"} {
		m := createMachine(t, env, ns, name, 1, "256Mi", func(m *kaironv1.Machine) {
			m.Labels = web
			m.Spec.NodeName = node.Name
		})
		setMachinePhase(t, env, m, kaironv1.MachineRunning)
	}
	solo := createMachine(t, env, ns, "solo", 1, "256Mi", func(m *kaironv1.Machine) { m.Spec.NodeName = node.Name })
	setMachinePhase(t, env, solo, kaironv1.MachineRunning)
	budget := &kaironv1.MachineDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-tier"},
		Spec:       kaironv1.MachineDisruptionBudgetSpec{Selector: web, MinAvailable: ptr.To(intstr.FromInt32(2))},
	}
	if err := env.Client.Create(ctx, budget); err != nil {
		t.Fatal(err)
	}

	// Migration phases are set by hand here.
	srv := startWebhookControllers(t, env, ns, Options{NoMigrationController: true})
	// Updates and deletes too, so the test sees the webhook allow them.
	cfg := srv.register(t, env, ns, MachineMigrationWebhookPath, []admissionregistrationv1.OperationType{
		admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete,
	}, "machinemigrations", "machinemigrations/status")

	migrate := func(name, machine string) error {
		return env.Client.Create(ctx, &kaironv1.MachineMigration{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       kaironv1.MachineMigrationSpec{MachineName: machine},
		})
	}
	// The API server picks the configuration up a moment after it is
	// created; until then the probe is let through and deleted again.
	wantMissing := `admission webhook "machinemigrations.kairon.zyvor.dev" denied the request: MachineMigration.kairon.zyvor.dev "probe" is invalid: ` +
		`spec.machineName: Invalid value: "no-such-machine": no Machine named "no-such-machine" exists in namespace "` + ns +
		`"; a MachineMigration moves an existing Machine of its own namespace`
	eventually(t, "the webhook to refuse a migration of a missing Machine", func() (bool, string) {
		err := migrate("probe", "no-such-machine")
		if err == nil {
			_ = env.Client.Delete(ctx, &kaironv1.MachineMigration{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "probe"}})
			return false, "created"
		}
		return err.Error() == wantMissing && apierrors.IsInvalid(err), err.Error()
	})

	refusal := func(name, machine, numbers string) string {
		return `admission webhook "machinemigrations.kairon.zyvor.dev" denied the request: ` +
			`moving machine ` + ns + `/` + machine + ` now would break its disruption budget: budget ` + ns +
			`/web-tier allows no more disruptions (` + numbers + `)`
	}
	steps := []struct {
		name, machine string
		want          string // "" for allowed
	}{
		// 3 healthy, 2 desired: one may go.
		{"move-web-1", "web-1", ""},
		// web-1's migration is in flight, so web-1 no longer counts.
		{"move-web-2", "web-2", refusal("move-web-2", "web-2", "2 healthy, 2 desired, 0 allowed")},
		// No budget matches solo.
		{"move-solo", "solo", ""},
		// Not even a second migration of web-1 itself: the budget is spent.
		{"move-web-1-again", "web-1", refusal("move-web-1-again", "web-1", "2 healthy, 2 desired, 0 allowed")},
		// No budget stops a second migration of solo, but its first is in
		// flight: two would move the same VM at once.
		{"move-solo-again", "solo", `admission webhook "machinemigrations.kairon.zyvor.dev" denied the request: ` +
			`machinemigrations.kairon.zyvor.dev "move-solo-again" is forbidden: machine solo already has a migration in flight: ` +
			`MachineMigration "move-solo" is Pending; wait for it to end or delete it`},
	}
	for _, step := range steps {
		err := migrate(step.name, step.machine)
		switch {
		case step.want == "" && err != nil:
			t.Errorf("%s: refused: %v", step.name, err)
		case step.want != "" && err == nil:
			t.Errorf("%s: created, want refused with %s", step.name, step.want)
		case strings.Contains(step.want, "in flight"):
			if err.Error() != step.want || !apierrors.IsForbidden(err) {
				t.Errorf("%s: refusal:\n got %v\nwant 403 %s", step.name, err, step.want)
			}
		case step.want != "" && (err.Error() != step.want || !apierrors.IsTooManyRequests(err)):
			t.Errorf("%s: refusal:\n got %v\nwant 429 %s", step.name, err, step.want)
		case step.want != "":
			if why, ok := rules.IsDisruptionRefusal(err); !ok || !strings.HasPrefix(why, "budget "+ns+"/web-tier allows no more disruptions") {
				t.Errorf("%s: the refusal does not carry the DisruptionBudget cause with the budget's account: %q, %v", step.name, why, ok)
			}
		}
	}

	// A generated name is not known yet when the webhook judges.
	err := env.Client.Create(ctx, &kaironv1.MachineMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "web-3-evac-"},
		Spec:       kaironv1.MachineMigrationSpec{MachineName: "web-3"},
	})
	if err == nil || !strings.Contains(err.Error(), "allows no more disruptions (2 healthy, 2 desired, 0 allowed)") {
		t.Errorf("generated-name migration over the budget: %v", err)
	}

	// Updates and deletes are never refused, even with the budget spent.
	var mig kaironv1.MachineMigration
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "move-web-1"}, &mig); err != nil {
		t.Fatal(err)
	}
	mig.Labels = map[string]string{"seen": "yes"}
	if err := env.Client.Update(ctx, &mig); err != nil {
		t.Errorf("relabeling a migration with the budget spent: %v", err)
	}
	mig.Status.Phase = kaironv1.MigrationRunning
	if err := env.Client.Status().Update(ctx, &mig); err != nil {
		t.Errorf("updating a migration's status: %v", err)
	}
	if err := env.Client.Delete(ctx, &kaironv1.MachineMigration{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "move-solo"}}); err != nil {
		t.Errorf("deleting a migration: %v", err)
	}

	// The move finishes: web-1 is healthy again, and the budget allows
	// the next one.
	mig.Status.Phase = kaironv1.MigrationSucceeded
	if err := env.Client.Status().Update(ctx, &mig); err != nil {
		t.Fatal(err)
	}
	if err := migrate("move-web-2", "web-2"); err != nil {
		t.Errorf("web-2 after web-1's migration succeeded: %v", err)
	}

	// Without the webhook configuration (the default) nothing is refused.
	if err := env.Client.Delete(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a migration over the budget to be created without the webhook", func() (bool, string) {
		err := migrate("unchecked", "web-3")
		if err != nil {
			return false, err.Error()
		}
		return true, ""
	})
}
