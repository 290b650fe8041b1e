package kaironctl_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// migrationPolicy creates a cluster-scoped policy, deleted when the test ends.
func migrationPolicy(t *testing.T, env *testenv.Env, name string, spec kaironv1.MigrationPolicySpec) *kaironv1.MigrationPolicy {
	t.Helper()
	p := &kaironv1.MigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
	env.Create(t, p)
	t.Cleanup(func() {
		if err := env.Client.Delete(context.Background(), p); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting migration policy %s: %v", name, err)
		}
	})
	return p
}

// describe migrationpolicy prints the policy's JSON as stored, then every
// Machine it selects (by Machine and namespace labels, across namespaces)
// with the policy that wins for it: itself, one with more labels, or one
// with as many whose name sorts first. A policy that selects nothing
// prints the shared zero-match hint; get lists policies with their zeros.
func TestDescribeMigrationPolicy(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	ns, other := env.Namespace(t), env.Namespace(t)
	// Namespace labels unique to the test: policies are cluster-wide.
	team := map[string]string{"team": ns}
	for _, name := range []string{ns, other} {
		var n corev1.Namespace
		if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
			t.Fatal(err)
		}
		n.Labels["team"] = ns
		if err := env.Client.Update(ctx, &n); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range []struct{ ns, name, app, tier string }{
		{ns, "web-1", "web", ""}, {ns, "web-2", "web", "prod"}, {other, "web-3", "web", ""}, {ns, "db-1", "db", ""},
	} {
		mach := plainMachine(m.ns, m.name)
		mach.Labels = map[string]string{"app": m.app}
		if m.tier != "" {
			mach.Labels["tier"] = m.tier
		}
		env.Create(t, mach)
	}
	web := migrationPolicy(t, env, ns+"-web", kaironv1.MigrationPolicySpec{
		Selectors:             kaironv1.MigrationPolicySelectors{MachineSelector: map[string]string{"app": "web"}, NamespaceSelector: team},
		BandwidthPerMigration: ptr.To(resource.MustParse("64Mi")),
		MaxParallelMigrations: ptr.To[int32](0),
	})
	// More labels: wins for web-2.
	migrationPolicy(t, env, ns+"-web-prod", kaironv1.MigrationPolicySpec{
		Selectors: kaironv1.MigrationPolicySelectors{MachineSelector: map[string]string{"app": "web", "tier": "prod"}, NamespaceSelector: team},
	})
	// As many labels as web for web-3 (its namespace's name), and a name
	// that sorts first: wins there.
	migrationPolicy(t, env, ns+"-a-other", kaironv1.MigrationPolicySpec{
		Selectors: kaironv1.MigrationPolicySelectors{MachineSelector: map[string]string{"app": "web"},
			NamespaceSelector: map[string]string{"kubernetes.io/metadata.name": other}},
	})

	r := kctl(t, env, "describe", "migrationpolicy", web.Name).ok(t)
	jsonPart, text, found := strings.Cut(r.stdout, "}\n\n")
	if !found {
		t.Fatalf("no blank line after the JSON:\n%s", r.stdout)
	}
	var got kaironv1.MigrationPolicy
	if err := json.Unmarshal([]byte(jsonPart+"}"), &got); err != nil || got.Name != web.Name || got.Kind != "MigrationPolicy" ||
		got.Spec.MaxParallelMigrations == nil || *got.Spec.MaxParallelMigrations != 0 {
		t.Fatalf("JSON part: %v\n%s", err, jsonPart)
	}
	if !strings.HasPrefix(r.stdout, "{\n  \"apiVersion\": \"kairon.zyvor.dev/v1alpha1\",\n  \"kind\": \"MigrationPolicy\",\n") {
		t.Errorf("does not start with the raw JSON:\n%s", r.stdout)
	}
	shown := func(ns, name string) string {
		return fmt.Sprintf("  %-*s ", max(24, len(other)+len("/web-1")), ns+"/"+name)
	}
	want := "" +
		"Selection (recomputed now from Machines, namespaces and MigrationPolicies): 3 matching, this policy governs 1\n" +
		"Matching machines (3):\n" +
		shown(ns, "web-1") + "this policy wins (2 labels)\n" +
		shown(ns, "web-2") + "MigrationPolicy " + ns + "-web-prod wins (3 labels to this policy's 2)\n" +
		shown(other, "web-3") + "MigrationPolicy " + ns + "-a-other wins (2 labels each; its name sorts first)\n"
	// The namespaces' names order the rows; ns and other are random.
	if other < ns {
		want = "" +
			"Selection (recomputed now from Machines, namespaces and MigrationPolicies): 3 matching, this policy governs 1\n" +
			"Matching machines (3):\n" +
			shown(other, "web-3") + "MigrationPolicy " + ns + "-a-other wins (2 labels each; its name sorts first)\n" +
			shown(ns, "web-1") + "this policy wins (2 labels)\n" +
			shown(ns, "web-2") + "MigrationPolicy " + ns + "-web-prod wins (3 labels to this policy's 2)\n"
	}
	if text != want {
		t.Errorf("describe migrationpolicy:\n%s\nwant\n%s", text, want)
	}

	// Nothing selected: the hint every describe exception prints.
	migrationPolicy(t, env, ns+"-none", kaironv1.MigrationPolicySpec{
		Selectors: kaironv1.MigrationPolicySelectors{MachineSelector: map[string]string{"app": "cache"}, NamespaceSelector: team},
	})
	r = kctl(t, env, "describe", "mpol", ns+"-none").ok(t)
	_, text, _ = strings.Cut(r.stdout, "}\n\n")
	want = "" +
		"Selection (recomputed now from Machines, namespaces and MigrationPolicies): 0 matching, this policy governs 0\n" +
		"No Machines match migrationpolicy " + ns + "-none (selector app=cache, in any namespace whose labels match team=" + ns + "); " +
		"check with: kaironctl get machines -A -l app=cache and kubectl get namespaces -l team=" + ns + "\n"
	if text != want {
		t.Errorf("describe migrationpolicy with no matches:\n%s\nwant\n%s", text, want)
	}

	// get: a 0 is a number, an unset value a dash.
	r = kctl(t, env, "get", "migrationpolicies", web.Name).ok(t)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "NAME BANDWIDTH COMPLETION-S-PER-GIB PROGRESS-S AUTO-CONVERGE MAX-PARALLEL MAX-PER-NODE AGE" ||
		!strings.HasPrefix(strings.Join(strings.Fields(lines[1]), " "), web.Name+" 64Mi - - - 0 - ") {
		t.Errorf("get migrationpolicies:\n%s", r.stdout)
	}
	kctl(t, env, "describe", "migrationpolicy", "missing-"+ns).failed(t, `migrationpolicy "missing-`+ns+`" not found`)
}
