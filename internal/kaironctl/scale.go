package kaironctl

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/zyvor/kairon/internal/ops"
)

func newScaleCommand(o *Options) *cobra.Command {
	var replicas int64
	cmd := &cobra.Command{
		Use:   "scale (machineset|machinepool NAME | machineset/NAME | machinepool/NAME) --replicas N",
		Short: "Set the replicas of a MachineSet or MachinePool",
		Long: `Set spec.replicas of a MachineSet or MachinePool through its scale
subresource, the same way kubectl scale and a HorizontalPodAutoscaler do.`,
		Example: `  kaironctl scale machinepool agents --replicas 10
  kaironctl scale ms web --replicas 0
  kaironctl scale mp/agents --replicas 3`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError(cmd, "scale needs a KIND (%s) and a NAME", scalableKinds())
			}
			k, names, err := oneKindNamed("scale", args)
			if err != nil {
				return err
			}
			if !k.Scalable {
				return fmt.Errorf("%s cannot be scaled; scale works on %s", k.Resource, scalableKinds())
			}
			if len(names) != 1 {
				return usageError(cmd, "scale %s needs exactly one NAME, got %d", k.Singular, len(names))
			}
			if !cmd.Flags().Changed("replicas") {
				return usageError(cmd, "--replicas is required")
			}
			if replicas < 0 {
				return usageError(cmd, "--replicas must be 0 or more, got %d", replicas)
			}
			if replicas > 1<<31-1 {
				return usageError(cmd, "--replicas is too large: %d", replicas)
			}
			ns, err := o.Namespace()
			if err != nil {
				return err
			}
			c, err := o.Client()
			if err != nil {
				return err
			}
			name := names[0]
			if err := ops.Scale(cmd.Context(), c, k.object(ns, name), int32(replicas)); err != nil {
				return o.objectError(k, ns, name, err)
			}
			fmt.Fprintf(o.Out, "%s scaled\n", k.ref(name))
			return nil
		},
	}
	cmd.Flags().Int64Var(&replicas, "replicas", 0, "The new number of replicas (required, 0 or more)")
	return cmd
}

func scalableKinds() string {
	var names []string
	for _, k := range kinds {
		if k.Scalable {
			names = append(names, k.Resource)
		}
	}
	return strings.Join(names, ", ")
}
