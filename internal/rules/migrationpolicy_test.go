package rules

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

func policy(name string, machine, namespace map[string]string) kaironv1.MigrationPolicy {
	return kaironv1.MigrationPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: kaironv1.MigrationPolicySpec{Selectors: kaironv1.MigrationPolicySelectors{
			MachineSelector: machine, NamespaceSelector: namespace,
		}},
	}
}

func TestSelectMigrationPolicy(t *testing.T) {
	web := map[string]string{"app": "web"}
	webProd := map[string]string{"app": "web", "tier": "prod"}
	teamA := map[string]string{"team": "a"}
	cases := []struct {
		name        string
		policies    []kaironv1.MigrationPolicy
		machine, ns map[string]string
		want        string // "" is none
	}{
		{name: "no policies", machine: web, want: ""},
		{name: "machine selector matches", policies: []kaironv1.MigrationPolicy{policy("p", web, nil)}, machine: webProd, want: "p"},
		{name: "machine selector needs every label", policies: []kaironv1.MigrationPolicy{policy("p", webProd, nil)}, machine: web, want: ""},
		{name: "value must be equal", policies: []kaironv1.MigrationPolicy{policy("p", map[string]string{"app": "db"}, nil)}, machine: web, want: ""},
		{name: "namespace selector matches the namespace's labels", policies: []kaironv1.MigrationPolicy{policy("p", nil, teamA)}, machine: web, ns: teamA, want: "p"},
		{name: "namespace selector does not look at the machine's labels", policies: []kaironv1.MigrationPolicy{policy("p", nil, teamA)}, machine: teamA, ns: nil, want: ""},
		{name: "both selectors must match", policies: []kaironv1.MigrationPolicy{policy("p", web, teamA)}, machine: web, ns: map[string]string{"team": "b"}, want: ""},
		{name: "empty selectors select every machine", policies: []kaironv1.MigrationPolicy{policy("default", nil, nil)}, machine: nil, want: "default"},
		{
			name:     "most labels wins over fewer",
			policies: []kaironv1.MigrationPolicy{policy("a-broad", web, nil), policy("z-narrow", webProd, nil)},
			machine:  webProd, want: "z-narrow",
		},
		{
			name:     "machine and namespace labels add up",
			policies: []kaironv1.MigrationPolicy{policy("a-two-machine", webProd, nil), policy("b-one-each", web, teamA), policy("c-all", webProd, teamA)},
			machine:  webProd, ns: teamA, want: "c-all",
		},
		{
			name:     "a tie goes to the name that sorts first",
			policies: []kaironv1.MigrationPolicy{policy("zeta", webProd, nil), policy("alpha", web, teamA)},
			machine:  webProd, ns: teamA, want: "alpha",
		},
		{
			name:     "tie broken by name whatever the list order",
			policies: []kaironv1.MigrationPolicy{policy("b", web, nil), policy("a", map[string]string{"tier": "prod"}, nil)},
			machine:  webProd, want: "a",
		},
		{
			name:     "the default loses to any selector that matches",
			policies: []kaironv1.MigrationPolicy{policy("a-default", nil, nil), policy("z-web", web, nil)},
			machine:  web, want: "z-web",
		},
		{
			name:     "a more specific policy that does not match does not win",
			policies: []kaironv1.MigrationPolicy{policy("broad", web, nil), policy("narrow", map[string]string{"app": "web", "tier": "dev"}, nil)},
			machine:  webProd, want: "broad",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := SelectMigrationPolicy(c.policies, c.machine, c.ns)
			name := ""
			if got != nil {
				name = got.Name
			}
			if name != c.want {
				t.Errorf("SelectMigrationPolicy = %q, want %q", name, c.want)
			}
		})
	}
}

func TestApplyMigrationPolicy(t *testing.T) {
	if ApplyMigrationPolicy(nil, &kaironv1.Machine{}) != nil {
		t.Error("no policy applied something")
	}
	p := policy("p", nil, nil)
	p.Spec.BandwidthPerMigration = ptr.To(resource.MustParse("64Mi"))
	p.Spec.CompletionTimeoutPerGiB = ptr.To[int64](150)
	p.Spec.ProgressTimeout = ptr.To[int64](30)
	p.Spec.AllowAutoConverge = ptr.To(true)
	cases := []struct {
		memory string
		want   int64
	}{
		{"1Gi", 150},
		{"4Gi", 600},
		{"256Mi", 38}, // 37.5 rounded up
		{"1Mi", 1},    // 0.146 s rounds up to a whole second
		{"", 38},      // the default 256Mi
		{"1536Mi", 225},
	}
	for _, c := range cases {
		m := &kaironv1.Machine{}
		if c.memory != "" {
			m.Spec.Memory = resource.MustParse(c.memory)
		}
		got := ApplyMigrationPolicy(&p, m)
		if got.Name != "p" || got.CompletionTimeoutSeconds == nil || *got.CompletionTimeoutSeconds != c.want {
			t.Errorf("memory %q: completion timeout %v, want %d", c.memory, got.CompletionTimeoutSeconds, c.want)
		}
		if got.BandwidthPerMigration.Value() != 64<<20 || *got.ProgressTimeoutSeconds != 30 || !*got.AllowAutoConverge {
			t.Errorf("memory %q: applied %+v", c.memory, got)
		}
	}
	bare := ApplyMigrationPolicy(ptr.To(policy("bare", nil, nil)), &kaironv1.Machine{})
	if bare.BandwidthPerMigration != nil || bare.CompletionTimeoutSeconds != nil || bare.ProgressTimeoutSeconds != nil || bare.AllowAutoConverge != nil {
		t.Errorf("a policy without values applied %+v", bare)
	}
}

func TestMigrationParallelLimit(t *testing.T) {
	running := func(sources ...string) []*kaironv1.MachineMigration {
		var out []*kaironv1.MachineMigration
		for _, s := range sources {
			out = append(out, &kaironv1.MachineMigration{Status: kaironv1.MachineMigrationStatus{Phase: kaironv1.MigrationRunning, SourceNode: s}})
		}
		return out
	}
	limits := func(cluster, node *int32) *kaironv1.MigrationPolicy {
		p := policy("limits", nil, nil)
		p.Spec.MaxParallelMigrations, p.Spec.MaxParallelOutboundPerNode = cluster, node
		return &p
	}
	cases := []struct {
		name    string
		policy  *kaironv1.MigrationPolicy
		running []*kaironv1.MachineMigration
		want    string // a part of the message; "" may start
	}{
		{name: "no policy", running: running("a", "a", "a")},
		{name: "no limits", policy: limits(nil, nil), running: running("a", "a")},
		{name: "under the cluster limit", policy: limits(ptr.To[int32](3), nil), running: running("a", "b")},
		{name: "at the cluster limit", policy: limits(ptr.To[int32](2), nil), running: running("a", "b"), want: "allows 2 migrations at once in the cluster (maxParallelMigrations) and 2 are Running"},
		{name: "zero holds every migration", policy: limits(ptr.To[int32](0), nil), want: "allows 0 migrations at once in the cluster"},
		{name: "other nodes do not count per node", policy: limits(nil, ptr.To[int32](1)), running: running("b", "c")},
		{name: "at the node limit", policy: limits(nil, ptr.To[int32](1)), running: running("b", "a"), want: "allows 1 migrations at once out of one node (maxParallelOutboundPerNode) and 1 are Running out of node a"},
		{name: "node limit with the cluster limit free", policy: limits(ptr.To[int32](5), ptr.To[int32](2)), running: running("a", "a"), want: "out of node a"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := MigrationParallelLimit(c.policy, "a", c.running)
			if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
				t.Errorf("MigrationParallelLimit = %q, want %q", got, c.want)
			}
		})
	}
}

func TestMigrationPolicyReceipts(t *testing.T) {
	machine := func(ns, name string, labels map[string]string) kaironv1.Machine {
		return kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}}
	}
	policies := []kaironv1.MigrationPolicy{
		policy("web", map[string]string{"app": "web"}, nil),
		policy("web-prod", map[string]string{"app": "web", "tier": "prod"}, nil),
	}
	machines := []kaironv1.Machine{
		machine("b", "w2", map[string]string{"app": "web", "tier": "prod"}),
		machine("a", "w1", map[string]string{"app": "web"}),
		machine("a", "db", map[string]string{"app": "db"}),
	}
	got := MigrationPolicyReceipts("web", policies, machines, nil)
	want := []PolicyReceipt{
		{Namespace: "a", Name: "w1", Winner: "web", Score: 1, WinnerScore: 1},
		{Namespace: "b", Name: "w2", Winner: "web-prod", Score: 1, WinnerScore: 2},
	}
	if len(got) != len(want) {
		t.Fatalf("receipts %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("receipt %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if r := MigrationPolicyReceipts("missing", policies, machines, nil); r != nil {
		t.Errorf("receipts of a missing policy: %+v", r)
	}
}
