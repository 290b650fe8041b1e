package kaironctl

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

func newDescribeCommand(o *Options) *cobra.Command {
	return &cobra.Command{
		Use:   "describe (KIND NAME | KIND/NAME)",
		Short: "Print one object as JSON, exactly as the API server has it",
		Long: `Print one object exactly as the API server returns it: indented JSON, with
apiVersion and kind, and nothing else.

Five exceptions add text after a blank line: describe machinepool shows the
image its members run (the template's reference, the digest the pool pinned
it to and when it asked the registry) and its members grouped by image. The
four others are recomputed now rather than read
from the status: describe quota lists the Machines the quota counts and why,
describe budget the budget's numbers and every Machine it matches, in any
namespace, as healthy or not and why, describe snapshotschedule every Machine
the schedule matches with its newest Ready snapshot (or why it has none), and
describe migrationpolicy every Machine the policy selects and whether it or
another policy (which) governs its migrations. When no Machine matches, each
of those four prints the same one-line hint
instead of an empty list: the object, what it selects and where, and the
kaironctl get command that lists those Machines.`,
		Example: `  kaironctl describe machine web-1
  kaironctl describe machineclaim/job-42
  kaironctl describe machinepool agents
  kaironctl describe quota team-a -n team-a
  kaironctl describe budget web-tier
  kaironctl describe snapshotschedule nightly
  kaironctl describe migrationpolicy slow-links`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError(cmd, "describe needs a KIND and a NAME (or KIND/NAME); valid kinds: %s", kindList())
			}
			k, names, err := oneKindNamed("describe", args)
			if err != nil {
				return err
			}
			if len(names) == 0 {
				return usageError(cmd, "describe %s needs a NAME", args[0])
			}
			if len(names) > 1 {
				return usageError(cmd, "describe takes one KIND and one NAME, got %d arguments", len(args))
			}
			ns, err := o.namespaceOf(k, false)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			obj, err := o.getObject(ctx, k, ns, names[0])
			if err != nil {
				return err
			}
			// The server sets both for a single GET; make sure anyway.
			if obj.GetAPIVersion() == "" || obj.GetKind() == "" {
				obj.SetAPIVersion(k.GVR.GroupVersion().String())
				obj.SetKind(k.GoKind)
			}
			if err := printJSON(o.Out, obj.Object); err != nil {
				return err
			}
			if k.Describe == nil {
				return nil
			}
			fmt.Fprintln(o.Out)
			return k.Describe(ctx, o, obj, o.Out)
		},
	}
}

// describeQuota explains a MachineQuota's usage: it recomputes it from the
// namespace's Machines with the same function kairon-controller uses, then
// lists every Machine, counted or not, with the reason.
func describeQuota(ctx context.Context, o *Options, obj *unstructured.Unstructured, w io.Writer) error {
	var q kaironv1.MachineQuota
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &q); err != nil {
		return fmt.Errorf("reading machinequota %q: %w", obj.GetName(), err)
	}
	machines, err := o.listMachines(ctx, q.Namespace)
	if err != nil {
		return err
	}
	used, charges := rules.QuotaUsage(&q, machines)
	return printQuotaUsage(w, &q, used, charges)
}

// printQuotaUsage is the text after the JSON in `describe quota`.
func printQuotaUsage(w io.Writer, q *kaironv1.MachineQuota, used kaironv1.MachineResources, charges []rules.QuotaCharge) error {
	hard := q.Spec.Hard
	fmt.Fprintf(w, "Usage (recomputed now from Machines): machines %s/%s, cpu %s/%s, memory %s/%s\n",
		usedInt(used.Machines), limitInt(hard.Machines),
		usedInt(used.CPU), limitInt(hard.CPU),
		usedQuantity(used.Memory), limitQuantity(hard.Memory))
	if len(charges) == 0 {
		// A quota charges every Machine of its namespace.
		fmt.Fprintln(w, zeroMatchHint(machineMatch{Kind: "quota", Name: q.Name, Namespace: q.Namespace}))
		return nil
	}
	sorted := append([]rules.QuotaCharge(nil), charges...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Machine < sorted[j].Machine })
	fmt.Fprintf(w, "Machines (%d):\n", len(sorted))
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	for _, c := range sorted {
		fmt.Fprintln(tw, "  "+c.Machine+"\t"+chargeVerdict(c))
	}
	return tw.Flush()
}

func usedInt(v *int32) string {
	if v == nil {
		return "0"
	}
	return itoa(int64(*v))
}

func limitInt(v *int32) string {
	if v == nil {
		return "unlimited"
	}
	return itoa(int64(*v))
}

func usedQuantity(q *resource.Quantity) string {
	if q == nil {
		return "0"
	}
	return q.String()
}

func limitQuantity(q *resource.Quantity) string {
	if q == nil {
		return "unlimited"
	}
	return q.String()
}

// chargeVerdict is "counted: why" or "not counted: why". QuotaUsage's
// reasons already start with the verdict; one that does not gets it added.
func chargeVerdict(c rules.QuotaCharge) string {
	verdict := "counted"
	if !c.Counted {
		verdict = "not counted"
	}
	reason := oneLine(c.Reason)
	switch {
	case reason == "":
		return verdict
	case strings.HasPrefix(reason, verdict+":") || reason == verdict:
		return reason
	}
	return verdict + ": " + reason
}
