package kaironctl

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

func newRolloutCommand(o *Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rollout COMMAND",
		Short: "Replace the warm members of a MachinePool, resolving its image's tag again",
		Long: `rollout restart replaces a MachinePool's warm members, the way kubectl rollout
restart replaces a Deployment's pods: it sets the annotation
` + kaironv1.AnnotationRestartedAt + ` in the pool's spec.template.metadata.annotations
to the current time. That is a new template, so the pool deletes its warm
members and creates new ones at once. Claimed members belong to their claims
and are never touched.

A pool whose template names an OCI image by tag pins its members to the
digest the tag named when the template was new (status.image); a tag that
moves later changes nothing in the pool. rollout restart is how a pool takes
the tag's new digest: with the new template it asks the registry again, and
the new warm members run what the tag names now. kaironctl describe
machinepool shows the digest and when it was resolved.`,
		Example: `  kaironctl rollout restart machinepool agents
  kaironctl rollout restart mp/agents -n team-a -o yaml`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError(cmd, "unknown rollout command %q; rollout has: restart", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return usageError(cmd, "rollout needs a command: restart")
		},
	}
	cmd.AddCommand(newRolloutRestartCommand(o))
	return cmd
}

func newRolloutRestartCommand(o *Options) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "restart (machinepool NAME... | machinepool/NAME...)",
		Short: "Replace the warm members of MachinePools, resolving their image's tag again",
		Long: `Stamp ` + kaironv1.AnnotationRestartedAt + ` with the current time in each named
MachinePool's spec.template.metadata.annotations. The new template makes the
pool replace its warm members (never its claimed ones) and resolve its OCI
image's tag again. It prints "machinepool/NAME restarted" for each, or with
-o json or yaml the pools as the API server stored them.`,
		Example: `  kaironctl rollout restart machinepool agents
  kaironctl rollout restart mp/agents mp/builders -n team-a
  kaironctl rollout restart machinepool agents -o json`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError(cmd, "rollout restart needs a KIND (machinepool) and a NAME")
			}
			k, names, err := oneKindNamed("rollout restart", args)
			if err != nil {
				return err
			}
			if k.GoKind != "MachinePool" {
				return fmt.Errorf("%s cannot be restarted; rollout restart works on machinepools", k.Resource)
			}
			if len(names) == 0 {
				return usageError(cmd, "rollout restart %s needs a NAME", args[0])
			}
			switch output {
			case "", outputJSON, outputYAML:
			default:
				return usageError(cmd, "unknown output format %q for -o/--output; rollout restart prints json or yaml (or, without -o, one line per pool)", output)
			}
			return o.runRolloutRestart(cmd, k, names, output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "Print the restarted pools as json or yaml instead of one line each")
	return cmd
}

func (o *Options) runRolloutRestart(cmd *cobra.Command, k *Kind, names []string, output string) error {
	ns, err := o.Namespace()
	if err != nil {
		return err
	}
	c, err := o.Client()
	if err != nil {
		return err
	}
	var printed []map[string]any
	var errs []error
	for _, name := range names {
		pool, err := restartPool(cmd, c, ns, name)
		if err != nil {
			errs = append(errs, o.objectError(k, ns, name, err))
			continue
		}
		if output == "" {
			fmt.Fprintf(o.Out, "%s restarted\n", k.ref(name))
			continue
		}
		obj, err := printable(pool, kaironv1.GroupVersion.WithKind("MachinePool"))
		if err != nil {
			return err
		}
		printed = append(printed, obj)
	}
	if output != "" && len(printed) > 0 {
		var v any = printed[0]
		if len(names) > 1 {
			items := make([]any, len(printed))
			for i := range printed {
				items[i] = printed[i]
			}
			v = map[string]any{"apiVersion": "v1", "kind": "List", "items": items}
		}
		if output == outputJSON {
			err = printJSON(o.Out, v)
		} else {
			err = printYAML(o.Out, v)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// restartPool stamps pool ns/name's template with the time now, and
// returns the pool as stored. The stamp has a second's precision, as
// kubectl's has; a second restart within the same second gets
// nanoseconds, so that it too is a new template.
func restartPool(cmd *cobra.Command, c client.Client, ns, name string) (*kaironv1.MachinePool, error) {
	pool := &kaironv1.MachinePool{}
	if err := c.Get(cmd.Context(), client.ObjectKey{Namespace: ns, Name: name}, pool); err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	stamp := now.Format(time.RFC3339)
	if pool.Spec.Template.Metadata.Annotations[kaironv1.AnnotationRestartedAt] == stamp {
		stamp = now.Format(time.RFC3339Nano)
	}
	body, err := json.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{
		"metadata": map[string]any{"annotations": map[string]string{kaironv1.AnnotationRestartedAt: stamp}}}}})
	if err != nil {
		return nil, err
	}
	if err := c.Patch(cmd.Context(), pool, client.RawPatch(types.MergePatchType, body)); err != nil {
		return nil, err
	}
	return pool, nil
}
