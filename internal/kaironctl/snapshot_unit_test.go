package kaironctl

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

// describe snapshotschedule ends, when nothing matches, with the hint of
// the one function every describe exception uses, in the same shape as
// describe budget's.
func TestDescribeSnapshotScheduleSharesTheZeroMatchHint(t *testing.T) {
	s := &kaironv1.SnapshotSchedule{Spec: kaironv1.SnapshotScheduleSpec{Selector: map[string]string{"tier": "web"}, Schedule: "@daily"}}
	s.Name, s.Namespace = "nightly", "team-a"
	var out, budget bytes.Buffer
	if err := printScheduleState(&out, rules.ComputeScheduleState(s, nil, nil, time.Now()), time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := printBudgetState(&budget, &rules.BudgetState{Namespace: "team-a", Name: "web", Selector: map[string]string{"tier": "web"}}); err != nil {
		t.Fatal(err)
	}
	want := zeroMatchHint(machineMatch{Kind: "snapshotschedule", Name: "nightly", Namespace: "team-a", Selector: labels.SelectorFromSet(map[string]string{"tier": "web"})})
	if got := lastLine(out.String()); got != want {
		t.Errorf("describe snapshotschedule ends with\n%s\nwant\n%s", got, want)
	}
	if want != "No Machines match snapshotschedule nightly (selector tier=web, in namespace team-a); check with: kaironctl get machines -n team-a -l tier=web" {
		t.Errorf("hint %q", want)
	}
	// Both: a status line, then the hint in place of the list.
	for what, text := range map[string]string{"snapshotschedule": out.String(), "budget": budget.String()} {
		lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "Status (recomputed fresh from Machines/") || !strings.HasPrefix(lines[1], "No Machines match "+what+" ") {
			t.Errorf("describe %s with no matches is not status line + hint:\n%s", what, text)
		}
	}
}
