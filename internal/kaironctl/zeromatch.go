package kaironctl

import (
	"strings"

	"k8s.io/apimachinery/pkg/labels"
)

// machineMatch is which Machines a describe exception (describe budget,
// describe quota, describe snapshotschedule, describe migrationpolicy)
// lists after the object's JSON.
type machineMatch struct {
	// Kind and Name are the described object as the user calls it, e.g.
	// "budget" and "web-tier".
	Kind, Name string
	// Selector selects Machines by label; nil or empty selects every one.
	Selector labels.Selector
	// Namespace limits the Machines to one namespace; empty is any.
	Namespace string
	// NamespaceSelector, when not empty, limits them to the namespaces
	// whose labels it matches.
	NamespaceSelector labels.Selector
}

// zeroMatchHint is the line every describe exception prints in place of its
// list when no Machine matches: which object, what it selects and where, and
// the command that lists the same Machines, so the user can see why the list
// is empty rather than wonder. One function, so every describe says it the
// same way:
//
//	No Machines match budget web-tier (selector tier=web, in any namespace); check with: kaironctl get machines -A -l tier=web
//	No Machines match quota team (every Machine, in namespace team-a); check with: kaironctl get machines -n team-a
//	No Machines match migrationpolicy slow (selector app=db, in any namespace whose labels match team=a); check with: kaironctl get machines -A -l app=db and kubectl get namespaces -l team=a
func zeroMatchHint(m machineMatch) string {
	which, where := "every Machine", "in any namespace"
	check := []string{"kaironctl", "get", "machines"}
	if m.Namespace != "" {
		where = "in namespace " + m.Namespace
		check = append(check, "-n", m.Namespace)
	} else {
		check = append(check, "-A")
	}
	if !noSelector(m.Selector) {
		which = "selector " + m.Selector.String()
		check = append(check, "-l", shellWord(m.Selector.String()))
	}
	hint := "No Machines match " + m.Kind + " " + m.Name + " (" + which + ", " + where
	also := ""
	if !noSelector(m.NamespaceSelector) {
		hint += " whose labels match " + m.NamespaceSelector.String()
		also = " and kubectl get namespaces -l " + shellWord(m.NamespaceSelector.String())
	}
	return hint + "); check with: " + strings.Join(check, " ") + also
}

// noSelector says whether s selects everything.
func noSelector(s labels.Selector) bool { return s == nil || s.Empty() }

// shellWord quotes s for a shell when it has anything but letters, digits
// and = , . _ / -, so the printed command can be pasted as it is.
func shellWord(s string) string {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("=,._/-", r)) {
			return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
		}
	}
	return s
}
