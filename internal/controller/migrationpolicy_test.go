package controller

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// createMigrationPolicy creates a cluster-scoped MigrationPolicy that
// selects only the Machines of namespace ns (policies are shared by every
// test of the API server), and deletes it when the test ends.
func createMigrationPolicy(t *testing.T, env *testenv.Env, ns, name string, spec kaironv1.MigrationPolicySpec) *kaironv1.MigrationPolicy {
	t.Helper()
	if spec.Selectors.NamespaceSelector == nil {
		spec.Selectors.NamespaceSelector = map[string]string{}
	}
	spec.Selectors.NamespaceSelector["kubernetes.io/metadata.name"] = ns
	p := &kaironv1.MigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name}, Spec: spec}
	if err := env.Client.Create(context.Background(), p); err != nil {
		t.Fatalf("creating migration policy: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Client.Delete(context.Background(), p); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting migration policy %s: %v", p.Name, err)
		}
	})
	return p
}

// The controller starts migrations only as far as their MigrationPolicy's
// parallel limits allow: at most 2 Running in the cluster and 1 out of one
// node. Four migrations (three off node a, one off b) leave two Pending
// with ParallelLimitReached; each end lets exactly one waiting migration
// start, never more than the limits, until all ran. A started migration
// records the policy it runs under, its completion timeout scaled to the
// Machine's 2 GiB.
func TestMigrationPolicyParallelLimits(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	a := createNode(t, env, ns, "a", 16, "16Gi")
	b := createNode(t, env, ns, "b", 16, "16Gi")
	c := createNode(t, env, ns, "c", 16, "16Gi")
	source := map[string]string{"m1": a.Name, "m2": a.Name, "m3": a.Name, "m4": b.Name}
	for name, node := range source {
		m := createMachine(t, env, ns, name, 1, "2Gi", func(m *kaironv1.Machine) { m.Spec.NodeName = node })
		setMachinePhase(t, env, m, kaironv1.MachineRunning)
	}
	policy := createMigrationPolicy(t, env, ns, "limits", kaironv1.MigrationPolicySpec{
		BandwidthPerMigration:      ptr.To(resource.MustParse("32Mi")),
		CompletionTimeoutPerGiB:    ptr.To[int64](100),
		ProgressTimeout:            ptr.To[int64](20),
		AllowAutoConverge:          ptr.To(true),
		MaxParallelMigrations:      ptr.To[int32](2),
		MaxParallelOutboundPerNode: ptr.To[int32](1),
	})
	startControllers(t, env, ns, Options{})
	for name := range source {
		if err := env.Client.Create(ctx, &kaironv1.MachineMigration{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "move-" + name},
			Spec:       kaironv1.MachineMigrationSpec{MachineName: name, TargetNode: c.Name},
		}); err != nil {
			t.Fatal(err)
		}
	}

	// state lists the migrations, checks that the limits hold, and says
	// which are Running, waiting and ended.
	state := func() (running, waiting, ended []string, saw string) {
		t.Helper()
		var list kaironv1.MachineMigrationList
		if err := env.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		offA := 0
		var lines []string
		for _, mig := range list.Items {
			lines = append(lines, fmt.Sprintf("%s %s %s: %s", mig.Name, mig.Status.Phase, mig.Status.Reason, mig.Status.Message))
			switch {
			case mig.Status.Phase == kaironv1.MigrationRunning:
				running = append(running, mig.Name)
				if mig.Status.SourceNode == a.Name {
					offA++
				}
			case mig.Status.Phase.IsTerminal():
				ended = append(ended, mig.Name)
			case mig.Status.Reason == kaironv1.MigrationReasonParallelLimitReached:
				waiting = append(waiting, mig.Name)
			}
		}
		saw = strings.Join(lines, "; ")
		if len(running) > 2 || offA > 1 {
			t.Fatalf("%d migrations Running, %d off node a: over the policy's limits (2, 1 per node): %s", len(running), offA, saw)
		}
		sort.Strings(running)
		sort.Strings(waiting)
		return running, waiting, ended, saw
	}
	waitFor := func(what string, wantRunning, wantWaiting, wantEnded int) []string {
		t.Helper()
		var running []string
		eventually(t, what, func() (bool, string) {
			var waiting, ended []string
			var saw string
			running, waiting, ended, saw = state()
			return len(running) == wantRunning && len(waiting) == wantWaiting && len(ended) == wantEnded, saw
		})
		return running
	}
	end := func(name string) {
		t.Helper()
		eventually(t, name+" to be marked Succeeded by hand", func() (bool, string) {
			mig := getObject[kaironv1.MachineMigration](t, env, ns, name)
			mig.Status.Phase = kaironv1.MigrationSucceeded
			mig.Status.Reason = kaironv1.MigrationReasonSucceeded
			mig.Status.Message = "ended by the test"
			mig.Status.CompletionTime = &metav1.Time{Time: mig.CreationTimestamp.Time}
			if err := env.Client.Status().Update(ctx, mig); err != nil {
				return false, err.Error()
			}
			return true, ""
		})
	}

	running := waitFor("two migrations to run (one off each node) and two to wait", 2, 2, 0)
	if !contains(running, "move-m4") {
		t.Errorf("Running %v: the migration off node b should run beside one off node a", running)
	}
	_, waiting, _, _ := state()
	for _, name := range waiting {
		mig := getObject[kaironv1.MachineMigration](t, env, ns, name)
		if mig.Status.Phase != kaironv1.MigrationPending || mig.Status.StartTime != nil || mig.Status.TargetNode != "" ||
			!strings.Contains(mig.Status.Message, "MigrationPolicy "+policy.Name+" allows ") {
			t.Errorf("waiting %s: %+v, want Pending, not started, naming the policy's limit", name, mig.Status)
		}
	}
	for _, name := range running {
		mig := getObject[kaironv1.MachineMigration](t, env, ns, name)
		applied := mig.Status.MigrationPolicy
		if applied == nil || applied.Name != policy.Name || applied.BandwidthPerMigration.String() != "32Mi" ||
			*applied.CompletionTimeoutSeconds != 200 || *applied.ProgressTimeoutSeconds != 20 || !*applied.AllowAutoConverge {
			t.Errorf("%s runs under %s, want policy %s with 32Mi, 200 s (100 s per GiB of 2Gi), 20 s, auto-converge", name, fmtJSON(applied), policy.Name)
		}
		if !strings.HasSuffix(mig.Status.Message, "under MigrationPolicy "+policy.Name) {
			t.Errorf("%s message %q does not name the policy", name, mig.Status.Message)
		}
	}

	// The one off node a ends: the next off a starts; the other waits on.
	offA := running[0] // sorted: move-m4 is last
	end(offA)
	running = waitFor("a second migration off node a to start", 2, 1, 1)
	if !contains(running, "move-m4") || contains(running, offA) {
		t.Errorf("Running %v after %s ended, want move-m4 and another one off node a", running, offA)
	}
	// m4 ends: the cluster has room, but node a does not.
	end("move-m4")
	running = waitFor("the last one off node a to wait for its node", 1, 1, 2)
	end(running[0])
	running = waitFor("the last one to start", 1, 0, 3)
	end(running[0])
	waitFor("all to have run", 0, 0, 4)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Of two policies that select a Machine (one by namespace only, one by
// namespace and the Machine's app label), the one with more matching labels
// is recorded on its migration; a Machine only the first selects gets it.
func TestMigrationPolicyRecordsTheWinner(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	a := createNode(t, env, ns, "a", 16, "16Gi")
	b := createNode(t, env, ns, "b", 16, "16Gi")
	for _, name := range []string{"web", "db"} {
		m := createMachine(t, env, ns, name, 1, "1Gi", func(m *kaironv1.Machine) {
			m.Spec.NodeName = a.Name
			m.Labels = map[string]string{"app": name}
		})
		setMachinePhase(t, env, m, kaironv1.MachineRunning)
	}
	createMigrationPolicy(t, env, ns, "broad", kaironv1.MigrationPolicySpec{ProgressTimeout: ptr.To[int64](60)})
	narrow := createMigrationPolicy(t, env, ns, "web", kaironv1.MigrationPolicySpec{
		Selectors:       kaironv1.MigrationPolicySelectors{MachineSelector: map[string]string{"app": "web"}},
		ProgressTimeout: ptr.To[int64](5),
	})
	startControllers(t, env, ns, Options{})
	for _, name := range []string{"web", "db"} {
		if err := env.Client.Create(ctx, &kaironv1.MachineMigration{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       kaironv1.MachineMigrationSpec{MachineName: name, TargetNode: b.Name},
		}); err != nil {
			t.Fatal(err)
		}
	}
	var web, db *kaironv1.MachineMigration
	eventually(t, "both migrations to run", func() (bool, string) {
		web, db = getObject[kaironv1.MachineMigration](t, env, ns, "web"), getObject[kaironv1.MachineMigration](t, env, ns, "db")
		return web.Status.Phase == kaironv1.MigrationRunning && db.Status.Phase == kaironv1.MigrationRunning,
			fmt.Sprintf("web %s, db %s", web.Status.Phase, db.Status.Phase)
	})
	if p := web.Status.MigrationPolicy; p == nil || p.Name != narrow.Name || *p.ProgressTimeoutSeconds != 5 {
		t.Errorf("web runs under %s, want %s (2 labels beat 1)", fmtJSON(p), narrow.Name)
	}
	if p := db.Status.MigrationPolicy; p == nil || p.Name != ns+"-broad" || *p.ProgressTimeoutSeconds != 60 || p.CompletionTimeoutSeconds != nil {
		t.Errorf("db runs under %s, want %s-broad", fmtJSON(p), ns)
	}
}
