package kaironctl

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

// defaultFenceTimeout bounds fence --wait.
const defaultFenceTimeout = 10 * time.Minute

type fenceFlags struct {
	force   bool
	wait    bool
	timeout time.Duration
	output  string
}

func newFenceCommand(o *Options) *cobra.Command {
	f := &fenceFlags{}
	cmd := &cobra.Command{
		Use:   "fence NODE [--force] [--wait [--timeout 10m]] [-o json|yaml]",
		Short: "Attest that a node is down, so that Kairon brings its Machines back elsewhere",
		Long: `Attest that NODE is down (powered off, or its VMs killed) and let Kairon follow
through. fence puts the taint kairon.zyvor.dev/fenced=true:NoExecute on the
Node, with who did it and when, and prints what becomes of each Machine whose
spec.nodeName is NODE; kairon-controller then does it:

  - a MachineSet's or MachinePool's Machine is deleted (its VM finalizer
    finished, since the node's agent cannot) and its owner replaces it on
    another node;
  - a Machine with a Ready MachineSnapshot is recreated under its own name
    on another node from its newest snapshot: memory and devices as of that
    snapshot, and a claim bound to it stays bound;
  - a claimed Machine without a snapshot is deleted and its claim goes Lost,
    reason NodeFenced;
  - a Machine nothing owns, without a snapshot, stays on NODE.

The scheduler places nothing on a fenced node. kaironctl recover NODE lifts
the fence.

fence refuses a node whose agent is still alive (KaironAgentReady True, or
Ready on a node without it): its VMs may be running, and bringing them back
elsewhere would run them twice. Stop the node first, or pass --force when you
know its VMs are gone. With --wait, fence waits until kairon-controller has
dealt with every Machine and prints where each went.`,
		Example: `  kaironctl fence node-3
  kaironctl fence node-3 --wait
  kaironctl fence node-3 --force -o json`,
		RunE: func(cmd *cobra.Command, args []string) error {
			node, err := oneArg(cmd, "fence", "NODE", args)
			if err != nil {
				return err
			}
			if err := f.check(cmd); err != nil {
				return err
			}
			return o.runFence(cmd.Context(), node, f)
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&f.force, "force", false, "Fence the node even though its agent still reports in")
	fl.BoolVar(&f.wait, "wait", false, "Wait until every Machine of the node is dealt with, or --timeout passes")
	fl.DurationVar(&f.timeout, "timeout", defaultFenceTimeout, "With --wait: give up, and exit non-zero, after this long")
	fl.StringVarP(&f.output, "output", "o", "", "Print the report as json or yaml instead of lines")
	fl.Lookup("timeout").DefValue = "10m"
	return cmd
}

func newRecoverCommand(o *Options) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "recover NODE [-o json|yaml]",
		Short: "Lift the fence of a node",
		Long: `Lift the fence kaironctl fence put on NODE: the taint goes, the Node records
when (kairon.zyvor.dev/recovered-at), and the scheduler may place Machines
there again once its agent reports Ready.

An agent that starts on the node first destroys every VM it still runs whose
Machine now lives on another node, was recreated, or no longer exists, and
only then reports Ready. Machines left on the node (nothing owned them and they
had no snapshot) start there again.`,
		Example: `  kaironctl recover node-3`,
		RunE: func(cmd *cobra.Command, args []string) error {
			node, err := oneArg(cmd, "recover", "NODE", args)
			if err != nil {
				return err
			}
			format, err := fenceOutput(cmd, output)
			if err != nil {
				return err
			}
			return o.runRecover(cmd.Context(), node, format)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "Print the report as json or yaml instead of lines")
	return cmd
}

func fenceOutput(cmd *cobra.Command, output string) (string, error) {
	switch output {
	case "", outputJSON, outputYAML:
		return output, nil
	}
	return "", usageError(cmd, "invalid -o/--output %q: use json or yaml", output)
}

func (f *fenceFlags) check(cmd *cobra.Command) error {
	if _, err := fenceOutput(cmd, f.output); err != nil {
		return err
	}
	if !f.wait && cmd.Flags().Changed("timeout") {
		return usageError(cmd, "--timeout only applies with --wait")
	}
	if f.timeout <= 0 {
		return usageError(cmd, "--timeout must be positive, got %s", f.timeout)
	}
	return nil
}

// fenceReport is what fence and recover print with -o json|yaml.
type fenceReport struct {
	Node string `json:"node"`
	// Fenced is whether the node carries the fence now.
	Fenced bool `json:"fenced"`
	// AlreadyFenced: fence found the node fenced (or recover found it not).
	Unchanged   bool   `json:"unchanged,omitempty"`
	Forced      bool   `json:"forced,omitempty"`
	FencedAt    string `json:"fencedAt,omitempty"`
	FencedBy    string `json:"fencedBy,omitempty"`
	RecoveredAt string `json:"recoveredAt,omitempty"`
	// Machines are the Machines on the node, with what becomes of them.
	Machines []fenceReceipt `json:"machines"`
	Summary  string         `json:"summary"`
	// Done: with --wait, every Machine was dealt with.
	Done bool `json:"done,omitempty"`
}

type fenceReceipt struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Owner     string `json:"owner,omitempty"`
	Claim     string `json:"claim,omitempty"`
	// Action is Replace, Restore, ClaimLost, Leave or FinishDeletion.
	Action   string `json:"action"`
	Snapshot string `json:"snapshot,omitempty"`
	Why      string `json:"why"`
	Receipt  string `json:"receipt"`
	// Outcome is, with --wait, what happened.
	Outcome string `json:"outcome,omitempty"`

	uid types.UID // the Machine's on the node
}

func receiptsOf(node string, plan []rules.FenceDecision) []fenceReceipt {
	out := make([]fenceReceipt, 0, len(plan))
	for _, d := range plan {
		r := fenceReceipt{Namespace: d.Machine.Namespace, Name: d.Machine.Name, Owner: d.Owner, Claim: d.Claim,
			Action: string(d.Action), Why: d.Why, Receipt: d.Receipt(node), uid: d.Machine.UID}
		if d.Snapshot != nil {
			r.Snapshot = d.Snapshot.Name
		}
		out = append(out, r)
	}
	return out
}

func (o *Options) printFenceReport(format string, r *fenceReport) error {
	if format == outputJSON {
		return printJSON(o.Out, r)
	}
	return printYAML(o.Out, r)
}

// kaironNode reads NODE and refuses one that does not exist or runs no
// Kairon agent.
func (o *Options) kaironNode(ctx context.Context, name string) (client.WithWatch, *corev1.Node, error) {
	c, err := o.Client()
	if err != nil {
		return nil, nil, err
	}
	var node corev1.Node
	err = c.Get(ctx, client.ObjectKey{Name: name}, &node)
	if apierrors.IsNotFound(err) {
		return nil, nil, fmt.Errorf("node %q not found; list the nodes with: kaironctl get nodes", name)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("node %q: %w", name, err)
	}
	if !rules.IsKaironNode(&node) {
		return nil, nil, fmt.Errorf("node %q is not a Kairon node (no label %s); list the Kairon nodes with: kaironctl get nodes", name, kaironv1.LabelNode)
	}
	return c, &node, nil
}

func (o *Options) runFence(ctx context.Context, name string, f *fenceFlags) error {
	c, node, err := o.kaironNode(ctx, name)
	if err != nil {
		return err
	}
	report := &fenceReport{Node: name, Fenced: true}
	if rules.NodeFenced(node) {
		report.Unchanged = true
	} else {
		if rules.NodeAlive(node) && !f.force {
			return fmt.Errorf("node %s is not down: its agent still reports in (%s); fencing it would run its Machines twice. "+
				"Stop the node (or its VMs) first and wait for kaironctl get nodes to say AgentUnreachable or NotReady, or pass --force if you know its VMs are gone",
				name, aliveBecause(node))
		}
		report.Forced = rules.NodeAlive(node)
		if node, err = o.putFence(ctx, c, node); err != nil {
			return err
		}
	}
	report.FencedAt = node.Annotations[kaironv1.AnnotationFencedAt]
	report.FencedBy = node.Annotations[kaironv1.AnnotationFencedBy]

	plan, err := rules.LoadFencePlan(ctx, c, name)
	if err != nil {
		return err
	}
	report.Machines = receiptsOf(name, plan)
	report.Summary = rules.FenceSummary(plan)
	if f.output == "" {
		o.printFenceHeader(report)
		for _, r := range report.Machines {
			fmt.Fprintln(o.Out, r.Receipt)
		}
		fmt.Fprintf(o.Out, "node %s: %s\n", name, report.Summary)
	}
	if f.wait {
		err = o.waitFence(ctx, c, report, f)
	}
	if f.output != "" {
		if perr := o.printFenceReport(f.output, report); perr != nil {
			return perr
		}
	}
	return err
}

func (o *Options) printFenceHeader(r *fenceReport) {
	switch {
	case r.Unchanged:
		fmt.Fprintf(o.Out, "node %s is already fenced (since %s%s)\n", r.Node, r.FencedAt, byWhom(r.FencedBy))
	case r.Forced:
		fmt.Fprintf(o.Out, "node %s fenced with --force: its agent still reports in; if it runs VMs, it stops them once it sees their Machines elsewhere\n", r.Node)
	default:
		fmt.Fprintf(o.Out, "node %s fenced (taint %s=true:NoExecute); kairon-controller follows through:\n", r.Node, kaironv1.TaintNodeFenced)
	}
}

func byWhom(who string) string {
	if who == "" {
		return ""
	}
	return " by " + who
}

// aliveBecause says what makes node look alive.
func aliveBecause(node *corev1.Node) string {
	for _, c := range node.Status.Conditions {
		if string(c.Type) == kaironv1.NodeConditionAgentReady.String() {
			return fmt.Sprintf("%s is %s", c.Type, c.Status)
		}
	}
	return "Ready is True"
}

// putFence adds the taint and the who/when annotations, locked to the
// version read.
func (o *Options) putFence(ctx context.Context, c client.Client, node *corev1.Node) (*corev1.Node, error) {
	fenced := node.DeepCopy()
	fenced.Spec.Taints = append(fenced.Spec.Taints, rules.FenceTaint())
	if fenced.Annotations == nil {
		fenced.Annotations = map[string]string{}
	}
	fenced.Annotations[kaironv1.AnnotationFencedAt] = o.Now().UTC().Format(time.RFC3339)
	if who := o.whoAmI(ctx); who != "" {
		fenced.Annotations[kaironv1.AnnotationFencedBy] = who
	} else {
		delete(fenced.Annotations, kaironv1.AnnotationFencedBy)
	}
	if err := c.Patch(ctx, fenced, client.MergeFromWithOptions(node, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsConflict(err) {
			return nil, fmt.Errorf("node %s changed while it was being fenced; run kaironctl fence %s again", node.Name, node.Name)
		}
		return nil, fmt.Errorf("fencing node %s: %w", node.Name, err)
	}
	return fenced, nil
}

// whoAmI is the user the API server authenticates kaironctl as, "" when it
// will not say.
func (o *Options) whoAmI(ctx context.Context) string {
	cs, err := o.Clientset()
	if err != nil {
		return ""
	}
	review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return ""
	}
	return review.Status.UserInfo.Username
}

// waitFence waits until every Machine of the plan has left the node (but
// those left there on purpose) and fills in the outcomes.
func (o *Options) waitFence(ctx context.Context, c client.WithWatch, report *fenceReport, f *fenceFlags) error {
	onNode := selection{
		newList: func() client.ObjectList { return &kaironv1.MachineList{} },
		fields:  fields.OneTermEqualSelector("spec.nodeName", report.Node),
	}
	stay := map[string]bool{}
	for _, r := range report.Machines {
		if r.Action == string(rules.FenceLeave) {
			stay[r.Namespace+"/"+r.Name] = true
		}
	}
	deadline := time.Now().Add(f.timeout)
	var still []string
	_, err := waitFor(ctx, c, onNode, f.timeout, func(machines []client.Object) (bool, error) {
		still = still[:0]
		for _, m := range machines {
			if !stay[objectKey(m)] {
				still = append(still, objectKey(m))
			}
		}
		return len(still) == 0, nil
	})
	var stopped *waitError
	switch {
	case errors.As(err, &stopped) && ctx.Err() == nil:
		return fmt.Errorf("timed out after %s waiting for kairon-controller to deal with the Machines of node %s; still there: %v", shortDuration(f.timeout), report.Node, still)
	case err != nil:
		return fmt.Errorf("watching the machines on node %s: %w", report.Node, err)
	}
	// A restored Machine is done once its new self has a node.
	for _, r := range report.Machines {
		if r.Action != string(rules.FenceRestore) {
			continue
		}
		m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: r.Name}}
		_, err := waitForObject(ctx, c, m, time.Until(deadline), func(m *kaironv1.Machine) (bool, error) {
			return m != nil && m.UID != r.uid && m.Spec.NodeName != "", nil
		})
		if errors.As(err, &stopped) && ctx.Err() == nil {
			return fmt.Errorf("timed out after %s waiting for machine %s/%s to be restored on another node", shortDuration(f.timeout), r.Namespace, r.Name)
		}
		if err != nil {
			return fmt.Errorf("watching machine %s/%s: %w", r.Namespace, r.Name, err)
		}
	}
	for i := range report.Machines {
		r := &report.Machines[i]
		r.Outcome = o.fenceOutcome(ctx, c, report.Node, r)
		if f.output == "" {
			fmt.Fprintf(o.Out, "machine %s/%s: %s\n", r.Namespace, r.Name, r.Outcome)
		}
	}
	report.Done = true
	if f.output == "" {
		fmt.Fprintf(o.Out, "node %s: done\n", report.Node)
	}
	return nil
}

// fenceOutcome says where a Machine of the fenced node went.
func (o *Options) fenceOutcome(ctx context.Context, c client.Client, node string, r *fenceReceipt) string {
	if r.Action == string(rules.FenceLeave) {
		return "left on node " + node
	}
	var m kaironv1.Machine
	err := c.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: r.Name}, &m)
	switch {
	case apierrors.IsNotFound(err):
		if r.Claim != "" {
			return "deleted; claim " + r.Claim + " is Lost"
		}
		return "deleted"
	case err != nil:
		return "unknown: " + err.Error()
	case m.Spec.NodeName == "":
		return "recreated, waiting for a node"
	}
	return "recreated on node " + m.Spec.NodeName
}

func (o *Options) runRecover(ctx context.Context, name, format string) error {
	c, node, err := o.kaironNode(ctx, name)
	if err != nil {
		return err
	}
	report := &fenceReport{Node: name}
	if !rules.NodeFenced(node) {
		report.Unchanged = true
	} else {
		recovered := node.DeepCopy()
		recovered.Spec.Taints = nil
		for _, t := range node.Spec.Taints {
			if t.Key != kaironv1.TaintNodeFenced {
				recovered.Spec.Taints = append(recovered.Spec.Taints, t)
			}
		}
		delete(recovered.Annotations, kaironv1.AnnotationFencedAt)
		delete(recovered.Annotations, kaironv1.AnnotationFencedBy)
		if recovered.Annotations == nil {
			recovered.Annotations = map[string]string{}
		}
		recovered.Annotations[kaironv1.AnnotationRecoveredAt] = o.Now().UTC().Format(time.RFC3339)
		if err := c.Patch(ctx, recovered, client.MergeFromWithOptions(node, client.MergeFromWithOptimisticLock{})); err != nil {
			if apierrors.IsConflict(err) {
				return fmt.Errorf("node %s changed while its fence was being lifted; run kaironctl recover %s again", name, name)
			}
			return fmt.Errorf("lifting the fence of node %s: %w", name, err)
		}
		node = recovered
	}
	report.RecoveredAt = node.Annotations[kaironv1.AnnotationRecoveredAt]
	plan, err := rules.LoadFencePlan(ctx, c, name)
	if err != nil {
		return err
	}
	report.Machines = receiptsOf(name, plan)
	report.Summary = plural(len(plan), "Machine", "Machines") + " still on the node"
	if format != "" {
		return o.printFenceReport(format, report)
	}
	if report.Unchanged {
		fmt.Fprintf(o.Out, "node %s is not fenced; nothing to recover\n", name)
		return nil
	}
	fmt.Fprintf(o.Out, "node %s recovered: the fence is lifted; the scheduler may place Machines there once its agent reports Ready, "+
		"and the agent first destroys every VM whose Machine runs elsewhere now\n", name)
	for _, r := range report.Machines {
		fmt.Fprintf(o.Out, "machine %s/%s is still on node %s: it starts there again\n", r.Namespace, r.Name, name)
	}
	return nil
}
