package kaironctl

import (
	"bytes"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

func TestZeroMatchHint(t *testing.T) {
	mustParse := func(s string) labels.Selector {
		sel, err := labels.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return sel
	}
	for _, tc := range []struct {
		name string
		m    machineMatch
		want string
	}{{
		name: "selector in any namespace",
		m:    machineMatch{Kind: "budget", Name: "web-tier", Selector: labels.SelectorFromSet(map[string]string{"tier": "web", "zone": "a"})},
		want: "No Machines match budget web-tier (selector tier=web,zone=a, in any namespace); check with: kaironctl get machines -A -l tier=web,zone=a",
	}, {
		name: "empty selector in any namespace",
		m:    machineMatch{Kind: "budget", Name: "all", Selector: labels.SelectorFromSet(nil)},
		want: "No Machines match budget all (every Machine, in any namespace); check with: kaironctl get machines -A",
	}, {
		name: "no selector in one namespace",
		m:    machineMatch{Kind: "quota", Name: "team", Namespace: "team-a"},
		want: "No Machines match quota team (every Machine, in namespace team-a); check with: kaironctl get machines -n team-a",
	}, {
		name: "selector in one namespace",
		m:    machineMatch{Kind: "snapshotschedule", Name: "nightly", Namespace: "team-a", Selector: mustParse("tier in (db,cache)")},
		want: "No Machines match snapshotschedule nightly (selector tier in (cache,db), in namespace team-a); check with: kaironctl get machines -n team-a -l 'tier in (cache,db)'",
	}, {
		name: "selector with a negation",
		m:    machineMatch{Kind: "budget", Name: "not-db", Selector: mustParse("tier!=db,!canary")},
		want: "No Machines match budget not-db (selector !canary,tier!=db, in any namespace); check with: kaironctl get machines -A -l '!canary,tier!=db'",
	}, {
		name: "selector and namespace selector",
		m:    machineMatch{Kind: "migrationpolicy", Name: "slow", Selector: mustParse("tier=db"), NamespaceSelector: mustParse("env=prod")},
		want: "No Machines match migrationpolicy slow (selector tier=db, in any namespace whose labels match env=prod); check with: kaironctl get machines -A -l tier=db and kubectl get namespaces -l env=prod",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if got := zeroMatchHint(tc.m); got != tc.want {
				t.Errorf("got\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

// describe budget and describe quota print the hint from the one function:
// the same shape, only the object and its scope differ.
func TestDescribeExceptionsShareTheZeroMatchHint(t *testing.T) {
	var budget, quota bytes.Buffer
	if err := printBudgetState(&budget, &rules.BudgetState{Namespace: "team-a", Name: "web", Selector: map[string]string{"tier": "web"}}); err != nil {
		t.Fatal(err)
	}
	q := &kaironv1.MachineQuota{}
	q.Name, q.Namespace = "team", "team-a"
	if err := printQuotaUsage(&quota, q, kaironv1.MachineResources{}, nil); err != nil {
		t.Fatal(err)
	}
	for what, out := range map[string]string{
		"budget": lastLine(budget.String()),
		"quota":  lastLine(quota.String()),
	} {
		want := zeroMatchHint(machineMatch{Kind: "budget", Name: "web", Selector: labels.SelectorFromSet(map[string]string{"tier": "web"})})
		if what == "quota" {
			want = zeroMatchHint(machineMatch{Kind: "quota", Name: "team", Namespace: "team-a"})
		}
		if out != want {
			t.Errorf("describe %s ends with\n%s\nwant\n%s", what, out, want)
		}
		if !strings.HasPrefix(out, "No Machines match "+what+" ") || !strings.Contains(out, "); check with: kaironctl get machines ") {
			t.Errorf("describe %s hint is not in the shared shape: %s", what, out)
		}
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}
