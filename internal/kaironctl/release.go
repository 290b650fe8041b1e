package kaironctl

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

func newReleaseCommand(o *Options) *cobra.Command {
	var (
		waitForIt bool
		timeout   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "release (CLAIM | mc/CLAIM)",
		Short: "Delete a MachineClaim and let its Machine go per its reclaimPolicy",
		Long: `Delete the MachineClaim CLAIM. kairon-controller then deletes the claim's
egress policy and, by the claim's reclaimPolicy, either deletes its Machine
(Delete, the default) or strips the pool and claim labels and keeps it as a
plain Machine (Retain).

By default kaironctl waits for all of that and prints

  machineclaim/CLAIM released
  machine/MACHINE deleted                      (or)
  machine/MACHINE kept (reclaimPolicy Retain)

--wait=false returns once the API server has accepted the deletion.`,
		Example: `  kaironctl release agents-claim-3fa91c
  kaironctl release job-42 -n team-a --wait=false
  kaironctl release machineclaim/job-42`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError(cmd, "release needs exactly one CLAIM name, got %d arguments", len(args))
			}
			if timeout < 0 {
				return usageError(cmd, "--timeout must not be negative, got %s", timeout)
			}
			name, err := claimName(args[0])
			if err != nil {
				return err
			}
			return o.runRelease(cmd.Context(), name, waitForIt, timeout)
		},
	}
	cmd.Flags().BoolVar(&waitForIt, "wait", true, "Wait until the claim is gone and its Machine deleted or handed back")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "How long --wait waits (0 waits forever)")
	return cmd
}

// claimName reads release's argument: a claim's NAME, or KIND/NAME with a
// name of the machineclaims kind, as kaironctl claim -o name prints it.
func claimName(arg string) (string, error) {
	k, name, ok, err := splitKindName(arg)
	switch {
	case !ok:
		return "", fmt.Errorf("%q is not a CLAIM or mc/CLAIM", arg)
	case err != nil:
		return "", err
	case k != nil && k.Resource != "machineclaims":
		return "", fmt.Errorf("release works on claims; %q names a %s (to delete it: kaironctl delete %s)", arg, k.Singular, arg)
	}
	return name, nil
}

func (o *Options) runRelease(ctx context.Context, name string, waitForIt bool, timeout time.Duration) error {
	ns, err := o.Namespace()
	if err != nil {
		return err
	}
	claimKind, _ := lookupKind("machineclaims")
	machineKind, _ := lookupKind("machines")
	c, err := o.Client()
	if err != nil {
		return err
	}
	var claim kaironv1.MachineClaim
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &claim); err != nil {
		return o.objectError(claimKind, ns, name, err)
	}
	policy := claim.Spec.ReclaimPolicy
	if policy == "" {
		policy = kaironv1.ReclaimDelete
	}
	// The Machine only goes with the claim while the claim holds it.
	machine := ""
	if claim.Status.Phase == kaironv1.ClaimBound {
		machine = claim.Status.MachineName
	}

	uid := claim.UID
	if err := c.Delete(ctx, &claim, client.Preconditions{UID: &uid}); err != nil {
		return o.objectError(claimKind, ns, name, err)
	}
	if !waitForIt {
		fmt.Fprintf(o.Out, "%s released\n", claimKind.ref(name))
		switch {
		case machine == "":
		case policy == kaironv1.ReclaimRetain:
			fmt.Fprintf(o.Out, "%s kept (reclaimPolicy Retain)\n", machineKind.ref(machine))
		default:
			fmt.Fprintf(o.Out, "%s will be deleted (reclaimPolicy Delete)\n", machineKind.ref(machine))
		}
		return nil
	}

	waitCtx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		waitCtx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	if err := o.waitGone(waitCtx, claimKind, ns, name, timeout); err != nil {
		return err
	}
	fmt.Fprintf(o.Out, "%s released\n", claimKind.ref(name))
	if machine == "" {
		return nil
	}
	if policy == kaironv1.ReclaimRetain {
		if err := o.waitHandedBack(waitCtx, ns, machine, name, timeout); err != nil {
			return err
		}
		fmt.Fprintf(o.Out, "%s kept (reclaimPolicy Retain)\n", machineKind.ref(machine))
		return nil
	}
	if err := o.waitGone(waitCtx, machineKind, ns, machine, timeout); err != nil {
		return err
	}
	fmt.Fprintf(o.Out, "%s deleted\n", machineKind.ref(machine))
	return nil
}

// waitHandedBack waits until kairon-controller has made machine a plain
// Machine again: no longer labelled as claim's, nor as a pool member.
func (o *Options) waitHandedBack(ctx context.Context, ns, machine, claim string, timeout time.Duration) error {
	k, _ := lookupKind("machines")
	c, err := o.Client()
	if err != nil {
		return err
	}
	errDeleted := fmt.Errorf("%s%s was deleted, although claim %q has reclaimPolicy Retain", k.ref(machine), k.where(ns), claim)
	last, err := waitForObject(ctx, c, &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: machine}}, 0,
		func(m *kaironv1.Machine) (bool, error) {
			if m == nil {
				return false, errDeleted
			}
			_, pooled := m.Labels[kaironv1.LabelMachinePool]
			return m.Labels[kaironv1.LabelMachineClaim] != claim && !pooled, nil
		})
	var stopped *waitError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errDeleted):
		return err
	case !errors.As(err, &stopped):
		return o.objectError(k, ns, machine, err)
	}
	var msg string
	if last == nil {
		msg = fmt.Sprintf("could not read %s%s to see it handed back", k.ref(machine), k.where(ns))
	} else {
		labels := last.Labels
		msg = fmt.Sprintf("%s%s still carries its pool labels (%s=%s, %s=%s)", k.ref(machine), k.where(ns),
			kaironv1.LabelPoolState, labels[kaironv1.LabelPoolState], kaironv1.LabelMachineClaim, labels[kaironv1.LabelMachineClaim])
	}
	if timeout > 0 {
		msg += " after " + timeout.String()
	}
	return errors.New(msg + "; kairon-controller removes them when it hands the Machine back (raise --timeout or pass --wait=false)")
}
