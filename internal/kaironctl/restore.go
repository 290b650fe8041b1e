package kaironctl

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

type restoreFlags struct {
	name   string
	output string
}

func newRestoreCommand(o *Options) *cobra.Command {
	f := &restoreFlags{}
	cmd := &cobra.Command{
		Use:   "restore MACHINESNAPSHOT [--name NEW]",
		Short: "Create a Machine from a MachineSnapshot",
		Long: `Create a Machine (in the current namespace, or -n) that starts from the saved
memory and devices of MACHINESNAPSHOT instead of booting: its guest carries on
from the moment the snapshot was taken, with the new Machine's own address,
MAC and host name. Its spec.cpu, spec.memory and spec.image are the
snapshot's; spec.restoreFrom names the snapshot. It prints

  machine/NEW created from machinesnapshot/SNAPSHOT (taken AGE ago on NODE)

The scheduler places it on a node that reaches the snapshot's store (every
node of kairon-local; under Helm, the nodes sharing node.snapshots.store).
The snapshot must be Ready. The Machine it was taken of may still run: the
restored one is a second Machine.`,
		Example: `  kaironctl restore web-1-snap
  kaironctl restore nightly-web-1-20261203-0300 --name web-1-yesterday -n web`,
		RunE: func(cmd *cobra.Command, args []string) error {
			snapshot, err := oneArg(cmd, "restore", "MACHINESNAPSHOT", args)
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("name") {
				if f.name == "" {
					return usageError(cmd, "--name must not be empty")
				}
				if errs := validation.IsDNS1123Subdomain(f.name); len(errs) > 0 {
					return usageError(cmd, "--name %q is not a valid Machine name: %s", f.name, strings.Join(errs, "; "))
				}
			}
			switch f.output {
			case "", outputJSON, outputYAML:
			default:
				return usageError(cmd, "unknown output format %q for -o/--output; restore prints json or yaml (or, without -o, the created line)", f.output)
			}
			return o.runRestore(cmd, snapshot, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.name, "name", "", "Name of the new Machine (default MACHINE-restore-<6 hex digits>, MACHINE being the snapshot's)")
	fl.StringVarP(&f.output, "output", "o", "", "Print the created Machine as json or yaml instead of the created line")
	return cmd
}

func (o *Options) runRestore(cmd *cobra.Command, snapName string, f *restoreFlags) error {
	ns, err := o.Namespace()
	if err != nil {
		return err
	}
	c, err := o.Client()
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	snap := &kaironv1.MachineSnapshot{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: snapName}, snap); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("machinesnapshot %q not found in namespace %q", snapName, ns)
		}
		return err
	}
	name := f.name
	if name == "" {
		name = generatedRestoreName(snap.Spec.MachineName)
	}
	machine, err := rules.RestoredMachine(snap, name)
	if err != nil {
		return err
	}
	if err := c.Create(ctx, machine); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("machine %q already exists in namespace %q; choose another --name", name, ns)
		}
		return fmt.Errorf("creating machine %q: %w", name, err)
	}
	if f.output != "" {
		obj, err := printable(machine, kaironv1.GroupVersion.WithKind("Machine"))
		if err != nil {
			return err
		}
		if f.output == outputJSON {
			return printJSON(o.Out, obj)
		}
		return printYAML(o.Out, obj)
	}
	taken := rules.SnapshotTime(snap)
	fmt.Fprintf(o.Out, "machine/%s created from machinesnapshot/%s (taken %s ago on %s)\n",
		machine.Name, snap.Name, duration.HumanDuration(time.Since(taken)), snap.Status.Node)
	return nil
}

// generatedRestoreName is MACHINE-restore-<6 hex digits>, the Machine's
// part cut short when the whole would not be a valid name.
func generatedRestoreName(machine string) string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	suffix := "-restore-" + hex.EncodeToString(b)
	if limit := validation.DNS1123SubdomainMaxLength - len(suffix); len(machine) > limit {
		machine = strings.TrimRight(machine[:limit], ".-")
	}
	return machine + suffix
}
