package kaironctl

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/zyvor/kairon/internal/rules"
)

func TestPrintBudgetStateMatchesUserGuide(t *testing.T) {
	s := &rules.BudgetState{
		Namespace: "default", Name: "web-tier", Selector: map[string]string{"tier": "web"},
		ExpectedMachines: 3, CurrentHealthy: 2, DesiredHealthy: 2, DisruptionsAllowed: 0,
		Machines: []rules.BudgetMachine{
			{Namespace: "default", Name: "web-1", Healthy: true},
			{Namespace: "default", Name: "web-2", Healthy: true},
			{Namespace: "default", Name: "web-3", Migration: "m", Reason: rules.UnhealthyMigrationInFlight},
		},
	}
	// Verbatim from the user's guide to MachineDisruptionBudget.
	want := "" +
		"Status (recomputed fresh from Machines/MachineMigrations right now): 3 matching, 2 healthy, 2 desired healthy, 0 disruptions allowed\n" +
		"Matching machines (3):\n" +
		"  web-1                    healthy\n" +
		"  web-2                    healthy\n" +
		"  web-3                    NOT healthy (non-terminal MachineMigration in flight)\n"
	var buf bytes.Buffer
	if err := printBudgetState(&buf, s); err != nil {
		t.Fatal(err)
	}
	if buf.String() != want {
		t.Errorf("got\n%s\nwant\n%s", buf.String(), want)
	}
}

func TestPrintBudgetStateOtherNamespacesAndHints(t *testing.T) {
	// Other namespaces' Machines come after the budget's own, as ns/name,
	// and a long name widens the column for every row.
	s := &rules.BudgetState{
		Namespace: "team-a", Name: "web-tier", Selector: map[string]string{"tier": "web"},
		ExpectedMachines: 4, CurrentHealthy: 2, DesiredHealthy: 1, DisruptionsAllowed: 1,
		Machines: []rules.BudgetMachine{
			{Namespace: "a-first", Name: "web-9", Reason: "status.phase is Booting, not Running"},
			{Namespace: "team-a", Name: "web-2", Healthy: true},
			{Namespace: "team-a", Name: "web-1", Healthy: true},
			{Namespace: "zz-quite-a-long-namespace", Name: "web-1", Reason: "status.phase is Failed, not Running"},
		},
	}
	want := "" +
		"Status (recomputed fresh from Machines/MachineMigrations right now): 4 matching, 2 healthy, 1 desired healthy, 1 disruptions allowed\n" +
		"Matching machines (4):\n" +
		"  web-1                           healthy\n" +
		"  web-2                           healthy\n" +
		"  a-first/web-9                   NOT healthy (status.phase is Booting, not Running)\n" +
		"  zz-quite-a-long-namespace/web-1 NOT healthy (status.phase is Failed, not Running)\n"
	var buf bytes.Buffer
	if err := printBudgetState(&buf, s); err != nil {
		t.Fatal(err)
	}
	if buf.String() != want {
		t.Errorf("got\n%s\nwant\n%s", buf.String(), want)
	}

	// Nothing matches: a hint instead of an empty list.
	none := &rules.BudgetState{Namespace: "default", Name: "x", Selector: map[string]string{"tier": "web", "zone": "a"}, DesiredHealthy: 2}
	buf.Reset()
	_ = printBudgetState(&buf, none)
	want = "" +
		"Status (recomputed fresh from Machines/MachineMigrations right now): 0 matching, 0 healthy, 2 desired healthy, 0 disruptions allowed\n" +
		"No Machines match budget x (selector tier=web,zone=a, in any namespace); check with: kaironctl get machines -A -l tier=web,zone=a\n"
	if buf.String() != want {
		t.Errorf("got\n%s\nwant\n%s", buf.String(), want)
	}

	// An invalid budget says so.
	bad := &rules.BudgetState{Namespace: "default", Name: "x", Selector: map[string]string{"a": "b"}, Err: errors.New("neither spec.minAvailable nor spec.maxUnavailable is set; set exactly one")}
	buf.Reset()
	_ = printBudgetState(&buf, bad)
	if !strings.Contains(buf.String(), "Invalid budget: neither spec.minAvailable nor spec.maxUnavailable is set; set exactly one; until fixed, it blocks every disruption of the Machines it matches.\n") {
		t.Errorf("invalid budget:\n%s", buf.String())
	}
}

func TestBudgetSelectorFlags(t *testing.T) {
	for _, tc := range []struct {
		in      []string
		want    map[string]string
		wantErr string
	}{
		{in: []string{"tier=web"}, want: map[string]string{"tier": "web"}},
		{in: []string{"tier=web", "kairon.zyvor.dev/zone=a", "tier=web"}, want: map[string]string{"tier": "web", "kairon.zyvor.dev/zone": "a"}},
		{in: []string{"empty="}, want: map[string]string{"empty": ""}},
		{in: []string{"tier"}, wantErr: `invalid --selector "tier": want KEY=VALUE`},
		{in: []string{"=web"}, wantErr: `invalid --selector "=web": want KEY=VALUE`},
		{in: []string{"tier=web,zone=a"}, wantErr: `invalid --selector "tier=web,zone=a": one KEY=VALUE per --selector; repeat the flag`},
		{in: []string{"ti er=web"}, wantErr: `invalid --selector "ti er=web": label key "ti er"`},
		{in: []string{"tier=web", "tier=db"}, wantErr: `--selector gives label "tier" twice (tier=web and tier=db)`},
	} {
		got, err := parseSelectorFlags(tc.in)
		switch {
		case tc.wantErr == "" && (err != nil || !reflect.DeepEqual(got, tc.want)):
			t.Errorf("%q: got %v, %v; want %v", tc.in, got, err, tc.want)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%q: error %v, want one containing %q", tc.in, err, tc.wantErr)
		}
	}
}
