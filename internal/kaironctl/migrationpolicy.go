package kaironctl

import (
	"context"
	"fmt"
	"io"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

// policySelectors is a MigrationPolicy's two selectors in one cell:
// "machines app=web; namespaces team=a", "every Machine" when both are empty.
func policySelectors(p *kaironv1.MigrationPolicy) string {
	machines := labels.SelectorFromSet(p.Spec.Selectors.MachineSelector)
	namespaces := labels.SelectorFromSet(p.Spec.Selectors.NamespaceSelector)
	switch {
	case machines.Empty() && namespaces.Empty():
		return "every-machine"
	case namespaces.Empty():
		return "machines:" + machines.String()
	case machines.Empty():
		return "namespaces:" + namespaces.String()
	}
	return "machines:" + machines.String() + ";namespaces:" + namespaces.String()
}

// describeMigrationPolicy lists the Machines a MigrationPolicy selects and,
// for each, whether it or another policy governs its migrations, decided
// now by the same rules.SelectMigrationPolicy kairon-controller applies
// when it starts a migration.
func describeMigrationPolicy(ctx context.Context, o *Options, obj *unstructured.Unstructured, w io.Writer) error {
	var p kaironv1.MigrationPolicy
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &p); err != nil {
		return fmt.Errorf("reading migrationpolicy %q: %w", obj.GetName(), err)
	}
	c, err := o.Client()
	if err != nil {
		return err
	}
	receipts, err := rules.LoadMigrationPolicyReceipts(ctx, c, p.Name)
	if err != nil {
		return err
	}
	return printPolicyReceipts(w, &p, receipts)
}

// printPolicyReceipts is the text after the JSON in `describe
// migrationpolicy`.
func printPolicyReceipts(w io.Writer, p *kaironv1.MigrationPolicy, receipts []rules.PolicyReceipt) error {
	wins := 0
	for _, r := range receipts {
		if r.Winner == p.Name {
			wins++
		}
	}
	fmt.Fprintf(w, "Selection (recomputed now from Machines, namespaces and MigrationPolicies): %d matching, this policy governs %d\n", len(receipts), wins)
	if len(receipts) == 0 {
		fmt.Fprintln(w, zeroMatchHint(machineMatch{
			Kind: "migrationpolicy", Name: p.Name,
			Selector:          labels.SelectorFromSet(p.Spec.Selectors.MachineSelector),
			NamespaceSelector: labels.SelectorFromSet(p.Spec.Selectors.NamespaceSelector),
		}))
		return nil
	}
	width := budgetNameWidth
	for _, r := range receipts {
		width = max(width, len(r.Namespace)+1+len(r.Name))
	}
	fmt.Fprintf(w, "Matching machines (%d):\n", len(receipts))
	for _, r := range receipts {
		verdict := fmt.Sprintf("this policy wins (%s)", labelCount(r.Score))
		switch {
		case r.Winner == p.Name:
		case r.WinnerScore == r.Score:
			verdict = fmt.Sprintf("MigrationPolicy %s wins (%s each; its name sorts first)", r.Winner, labelCount(r.Score))
		default:
			verdict = fmt.Sprintf("MigrationPolicy %s wins (%s to this policy's %d)", r.Winner, labelCount(r.WinnerScore), r.Score)
		}
		fmt.Fprintf(w, "  %-*s %s\n", width, r.Namespace+"/"+r.Name, verdict)
	}
	return nil
}

func labelCount(n int) string {
	if n == 1 {
		return "1 label"
	}
	return itoa(int64(n)) + " labels"
}
