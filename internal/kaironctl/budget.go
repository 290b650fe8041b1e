package kaironctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

// budgetAliases are the names `create` and `edit` accept for a budget, the
// same the kinds table accepts everywhere else.
var budgetAliases = []string{"budgets", "mdb", "machinedisruptionbudget", "machinedisruptionbudgets"}

// budgetFlags are the flags of `create budget` and `edit budget`.
type budgetFlags struct {
	selector       []string
	minAvailable   string
	maxUnavailable string
}

func (f *budgetFlags) register(cmd *cobra.Command, selectorHelp string) {
	cmd.Flags().StringArrayVar(&f.selector, "selector", nil, selectorHelp)
	cmd.Flags().StringVar(&f.minAvailable, "min-available", "", "How many matching Machines must stay healthy: an integer (2) or a percentage (50%, rounded up)")
	cmd.Flags().StringVar(&f.maxUnavailable, "max-unavailable", "", "How many matching Machines may be unhealthy: an integer (1) or a percentage (25%, rounded up)")
}

// parsedBudgetFlags is what the flags that were given ask for.
type parsedBudgetFlags struct {
	selector       map[string]string // nil when --selector was not given
	minAvailable   *intstr.IntOrString
	maxUnavailable *intstr.IntOrString
}

// parse checks the flags that were given, before anything talks to the
// API server, so a mistake never creates or changes anything.
func (f *budgetFlags) parse(cmd *cobra.Command) (*parsedBudgetFlags, error) {
	var p parsedBudgetFlags
	minGiven, maxGiven := cmd.Flags().Changed("min-available"), cmd.Flags().Changed("max-unavailable")
	if minGiven && maxGiven {
		return nil, usageError(cmd, "--min-available and --max-unavailable cannot be used together: a budget sets exactly one of them")
	}
	if cmd.Flags().Changed("selector") {
		sel, err := parseSelectorFlags(f.selector)
		if err != nil {
			return nil, usageError(cmd, "%v", err)
		}
		p.selector = sel
	}
	parse := func(flag, value string) (*intstr.IntOrString, error) {
		v, err := rules.ParseBudgetValue(value)
		if err != nil {
			return nil, usageError(cmd, "invalid %s: %v", flag, err)
		}
		return &v, nil
	}
	var err error
	if minGiven {
		if p.minAvailable, err = parse("--min-available", f.minAvailable); err != nil {
			return nil, err
		}
	}
	if maxGiven {
		if p.maxUnavailable, err = parse("--max-unavailable", f.maxUnavailable); err != nil {
			return nil, err
		}
	}
	return &p, nil
}

// parseSelectorFlags turns repeated --selector KEY=VALUE into a label map,
// with the API server's rules for label keys and values.
func parseSelectorFlags(values []string) (map[string]string, error) {
	sel := map[string]string{}
	for _, kv := range values {
		key, value, ok := strings.Cut(kv, "=")
		if !ok || key == "" {
			return nil, fmt.Errorf("invalid --selector %q: want KEY=VALUE (repeat --selector for several labels)", kv)
		}
		if strings.Contains(value, ",") {
			return nil, fmt.Errorf("invalid --selector %q: one KEY=VALUE per --selector; repeat the flag for several labels", kv)
		}
		if errs := validation.IsQualifiedName(key); len(errs) > 0 {
			return nil, fmt.Errorf("invalid --selector %q: label key %q: %s", kv, key, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(value); len(errs) > 0 {
			return nil, fmt.Errorf("invalid --selector %q: label value %q: %s", kv, value, strings.Join(errs, "; "))
		}
		if prev, dup := sel[key]; dup && prev != value {
			return nil, fmt.Errorf("--selector gives label %q twice (%s=%s and %s=%s)", key, key, prev, key, value)
		}
		sel[key] = value
	}
	if len(sel) == 0 {
		return nil, fmt.Errorf("--selector needs at least one KEY=VALUE")
	}
	return sel, nil
}

// budgetName checks the NAME argument of create and edit.
func budgetName(cmd *cobra.Command, verb string, args []string) (string, error) {
	if _, err := oneArg(cmd, verb+" budget", "NAME", args); err != nil {
		return "", err
	}
	if errs := validation.IsDNS1123Subdomain(args[0]); len(errs) > 0 {
		return "", usageError(cmd, "invalid budget name %q: %s", args[0], strings.Join(errs, "; "))
	}
	return args[0], nil
}

// budgetKindOnly refuses a KIND that create or edit do not handle; the
// budget subcommand handles budgets.
func budgetKindOnly(cmd *cobra.Command, verb string, args []string) error {
	if len(args) == 0 {
		return usageError(cmd, "%s needs a KIND and a NAME; %s works on: budget", verb, verb)
	}
	k, err := lookupKind(args[0])
	if err != nil {
		return fmt.Errorf("%v; %s works on: budget", err, verb)
	}
	if k.Resource == "budgets" {
		// A spelling the subcommand does not take, e.g. "Budget".
		return usageError(cmd, "write the kind as budget: kaironctl %s budget NAME ...", verb)
	}
	return fmt.Errorf("kaironctl cannot %s %s; %s works on: budget (use kubectl for other kinds)", verb, k.Resource, verb)
}

func newCreateCommand(o *Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "create budget NAME ...",
		Short: "Create a disruption budget",
		Long: `Create an object from flags. Today create makes MachineDisruptionBudgets
only; write other kinds as YAML and apply them with kubectl.`,
		Example: `  kaironctl create budget web-tier --selector tier=web --min-available 2`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return budgetKindOnly(cmd, "create", args)
		},
	}
	cmd.AddCommand(newCreateBudgetCommand(o))
	return cmd
}

func newCreateBudgetCommand(o *Options) *cobra.Command {
	var f budgetFlags
	var allMachines bool
	cmd := &cobra.Command{
		Use:     "budget NAME (--selector KEY=VALUE... | --all-machines) (--min-available N|N% | --max-unavailable N|N%)",
		Aliases: budgetAliases,
		Short:   "Create a MachineDisruptionBudget",
		Long: `Create a MachineDisruptionBudget: a limit on how many of the Machines its
selector matches, in every namespace, evacuation may disrupt at once.

--selector is repeatable; a Machine matches when it carries every label given.
A budget without a selector matches every Machine of the cluster, in every
namespace, so one budget would hold back every evacuation and cordon drain:
create one only on purpose, with --all-machines instead of --selector.
Exactly one of --min-available and --max-unavailable is required,
each an integer or a percentage (0% to 100%) of the matching Machines, rounded
up as for a PodDisruptionBudget. Nothing is created when a flag is wrong.`,
		Example: `  kaironctl create budget web-tier --selector tier=web --min-available 2
  kaironctl create budget db --selector app=db --selector zone=a --max-unavailable 25%
  kaironctl create budget cluster-wide --all-machines --max-unavailable 10%`,
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := budgetName(cmd, "create", args)
			if err != nil {
				return err
			}
			p, err := f.parse(cmd)
			if err != nil {
				return err
			}
			switch {
			case allMachines && p.selector != nil:
				return usageError(cmd, "--all-machines and --selector cannot be used together: --all-machines is the budget without a selector")
			case allMachines:
				p.selector = nil
			case p.selector == nil:
				return usageError(cmd, "--selector KEY=VALUE is required (repeat it for several labels): "+
					"a budget without a selector matches every Machine of the cluster, in every namespace, and would hold back every evacuation; "+
					"if that is what you want, say so with --all-machines")
			}
			if p.minAvailable == nil && p.maxUnavailable == nil {
				return usageError(cmd, "one of --min-available or --max-unavailable is required: a budget sets exactly one of them")
			}
			return o.createBudget(cmd.Context(), name, p)
		},
	}
	f.register(cmd, "A label KEY=VALUE the Machines must carry (repeatable; required unless --all-machines)")
	cmd.Flags().BoolVar(&allMachines, "all-machines", false, "Create the budget without a selector: it then matches every Machine of the cluster, in every namespace")
	return cmd
}

// budgetTarget is the budgets kind, the namespace and the client.
func (o *Options) budgetTarget() (*Kind, string, client.Client, error) {
	k, err := lookupKind("budgets")
	if err != nil {
		return nil, "", nil, err
	}
	ns, err := o.Namespace()
	if err != nil {
		return nil, "", nil, err
	}
	c, err := o.Client()
	return k, ns, c, err
}

func (o *Options) createBudget(ctx context.Context, name string, p *parsedBudgetFlags) error {
	k, ns, c, err := o.budgetTarget()
	if err != nil {
		return err
	}
	b := &kaironv1.MachineDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: kaironv1.MachineDisruptionBudgetSpec{
			Selector:       p.selector,
			MinAvailable:   p.minAvailable,
			MaxUnavailable: p.maxUnavailable,
		},
	}
	if err := c.Create(ctx, b); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s %q already exists%s; change it with kaironctl edit budget %s", k.Singular, name, k.where(ns), name)
		}
		return o.objectError(k, ns, name, err)
	}
	fmt.Fprintf(o.Out, "%s created\n", k.ref(name))
	return nil
}

func newEditCommand(o *Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "edit budget NAME ...",
		Short: "Change fields of a disruption budget",
		Long: `Change an object's fields from flags. Today edit changes
MachineDisruptionBudgets only; use kubectl edit for other kinds.`,
		Example: `  kaironctl edit budget web-tier --min-available 3`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return budgetKindOnly(cmd, "edit", args)
		},
	}
	cmd.AddCommand(newEditBudgetCommand(o))
	return cmd
}

func newEditBudgetCommand(o *Options) *cobra.Command {
	var f budgetFlags
	cmd := &cobra.Command{
		Use:     "budget NAME [--selector KEY=VALUE]... [--min-available N|N% | --max-unavailable N|N%]",
		Aliases: budgetAliases,
		Short:   "Change a MachineDisruptionBudget's selector or bound",
		Long: `Change only the fields whose flags are given, with a merge patch.

--selector (repeatable) replaces the whole selector: labels not given again are
dropped. --min-available and --max-unavailable cannot be given together, and
edit changes the bound the budget already has: switching a budget from
minAvailable to maxUnavailable (or back) means clearing one field while setting
the other, which this verb does not do; use kubectl edit for that.`,
		Example: `  kaironctl edit budget web-tier --min-available 3
  kaironctl edit budget web-tier --selector tier=web --selector zone=b`,
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := budgetName(cmd, "edit", args)
			if err != nil {
				return err
			}
			if !cmd.Flags().Changed("selector") && !cmd.Flags().Changed("min-available") && !cmd.Flags().Changed("max-unavailable") {
				return usageError(cmd, "nothing to change: give --selector, --min-available or --max-unavailable")
			}
			p, err := f.parse(cmd)
			if err != nil {
				return err
			}
			return o.editBudget(cmd.Context(), name, p)
		},
	}
	f.register(cmd, "A label KEY=VALUE the Machines must carry (repeatable); replaces the whole selector")
	return cmd
}

func (o *Options) editBudget(ctx context.Context, name string, p *parsedBudgetFlags) error {
	k, ns, c, err := o.budgetTarget()
	if err != nil {
		return err
	}
	// Read, then merge-patch with the resourceVersion read (so the selector
	// keys to drop are those of the version patched); retry if it changed.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var b kaironv1.MachineDisruptionBudget
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &b); err != nil {
			return err
		}
		if err := refuseBoundSwitch(&b, p); err != nil {
			return err
		}
		patch := client.MergeFromWithOptions(b.DeepCopy(), client.MergeFromWithOptimisticLock{})
		if p.selector != nil {
			// The whole map is replaced: the patch drops the keys not given.
			b.Spec.Selector = p.selector
		}
		if p.minAvailable != nil {
			b.Spec.MinAvailable = p.minAvailable
		}
		if p.maxUnavailable != nil {
			b.Spec.MaxUnavailable = p.maxUnavailable
		}
		return c.Patch(ctx, &b, patch)
	})
	if err != nil {
		if errors.As(err, new(boundSwitchError)) {
			return err
		}
		return o.objectError(k, ns, name, err)
	}
	fmt.Fprintf(o.Out, "%s updated\n", k.ref(name))
	return nil
}

type boundSwitchError struct{ error }

// refuseBoundSwitch refuses to set the bound the budget does not use: the
// API server requires exactly one, and a merge patch that only sets the new
// one would leave both set.
func refuseBoundSwitch(b *kaironv1.MachineDisruptionBudget, p *parsedBudgetFlags) error {
	var has, flag string
	switch {
	case p.minAvailable != nil && b.Spec.MaxUnavailable != nil && b.Spec.MinAvailable == nil:
		has, flag = "spec.maxUnavailable", "--min-available"
	case p.maxUnavailable != nil && b.Spec.MinAvailable != nil && b.Spec.MaxUnavailable == nil:
		has, flag = "spec.minAvailable", "--max-unavailable"
	default:
		return nil
	}
	return boundSwitchError{fmt.Errorf("budget %q in namespace %q sets %s; edit does not switch it to %s, which would also have to clear %s: "+
		"change both fields at once with kubectl edit mdb %s -n %s", b.Name, b.Namespace, has, flag, has, b.Name, b.Namespace)}
}

// describeBudget explains a budget: it recomputes the budget's numbers with
// LoadBudgetStates, the function evacuation and the webhook decide with,
// rather than reading the status (which is up to a tick old), and lists
// every matching Machine as healthy or not, and why.
func describeBudget(ctx context.Context, o *Options, obj *unstructured.Unstructured, w io.Writer) error {
	c, err := o.Client()
	if err != nil {
		return err
	}
	states, err := rules.LoadBudgetStates(ctx, c)
	if err != nil {
		return err
	}
	s := rules.FindBudgetState(states, obj.GetNamespace(), obj.GetName())
	if s == nil {
		return fmt.Errorf("budget %q in namespace %q was deleted while describing it", obj.GetName(), obj.GetNamespace())
	}
	return printBudgetState(w, s)
}

// budgetNameWidth is the width of the Machine column in describe budget.
const budgetNameWidth = 24

// printBudgetState is the text after the JSON in `describe budget`.
func printBudgetState(w io.Writer, s *rules.BudgetState) error {
	fmt.Fprintf(w, "Status (recomputed fresh from Machines/MachineMigrations right now): %s\n", rules.BudgetSummary(s))
	if s.Err != nil {
		fmt.Fprintf(w, "Invalid budget: %v; until fixed, it blocks every disruption of the Machines it matches.\n", s.Err)
	}
	if len(s.Machines) == 0 {
		// A budget counts matching Machines of every namespace.
		fmt.Fprintln(w, zeroMatchHint(machineMatch{Kind: "budget", Name: s.Name, Selector: labels.SelectorFromSet(s.Selector)}))
		return nil
	}
	// The budget's own namespace first, by name; then the others.
	type row struct{ ns, name, shown, verdict string }
	rows := make([]row, len(s.Machines))
	width := budgetNameWidth
	for i, m := range s.Machines {
		r := row{ns: m.Namespace, name: m.Name, shown: m.Name, verdict: "healthy"}
		if m.Namespace != s.Namespace {
			r.shown = m.Namespace + "/" + m.Name
		}
		if !m.Healthy {
			r.verdict = "NOT healthy (" + m.Reason + ")"
		}
		width = max(width, len(r.shown))
		rows[i] = r
	}
	sort.SliceStable(rows, func(i, j int) bool {
		if own, ownJ := rows[i].ns == s.Namespace, rows[j].ns == s.Namespace; own != ownJ {
			return own
		}
		if rows[i].ns != rows[j].ns {
			return rows[i].ns < rows[j].ns
		}
		return rows[i].name < rows[j].name
	})
	fmt.Fprintf(w, "Matching machines (%d):\n", len(rows))
	for _, r := range rows {
		fmt.Fprintf(w, "  %-*s %s\n", width, r.shown, r.verdict)
	}
	return nil
}
