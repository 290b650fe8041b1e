package kaironctl

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func newDeleteCommand(o *Options) *cobra.Command {
	var (
		waitForGone, all bool
		selector         string
		timeout          time.Duration
	)
	cmd := &cobra.Command{
		Use:   "delete (KIND NAME... | KIND/NAME... | KIND[,KIND...] (-l SELECTOR | --all))",
		Short: "Delete objects by name and wait until they are gone",
		Long: `Delete the named objects: KIND NAME... for objects of one kind, or
KIND/NAME... (as -o name prints them) for any mix of kinds; or, with no
names, every object of the kinds given that -l SELECTOR matches, or all of
them with --all, in the namespace. By default kaironctl waits until each is
really gone (a Machine is kept until its node agent has stopped the VM) and
then prints "KIND/NAME deleted"; --wait=false returns once the API server
has accepted the deletion.`,
		Example: `  kaironctl delete machine web-1 web-2
  kaironctl delete mp agents --timeout 2m
  kaironctl delete machineclaim/job-42 machine/web-3
  kaironctl delete machineclaim job-42 --wait=false
  kaironctl delete mc -l team=ml`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError(cmd, "delete needs a KIND and at least one NAME (or KIND/NAME); valid kinds: %s", kindList())
			}
			groups, err := parseObjectArgs(args)
			if err != nil {
				return err
			}
			byName := named(groups)
			switch {
			case byName && (all || selector != ""):
				return usageError(cmd, "delete takes NAMEs, or -l/--selector or --all, not both")
			case !byName && !all && selector == "":
				return usageError(cmd, "delete %s needs at least one NAME, or -l/--selector or --all", args[0])
			case all && selector != "":
				return usageError(cmd, "--all deletes every object of the kind; it cannot be used with -l/--selector")
			}
			if selector != "" {
				if _, err := labels.Parse(selector); err != nil {
					return fmt.Errorf("invalid -l/--selector %q: %v", selector, err)
				}
			}
			if timeout < 0 {
				return usageError(cmd, "--timeout must not be negative, got %s", timeout)
			}
			ctx := cmd.Context()
			var targets []objectName
			var found []kindItems
			for _, g := range groups {
				ns, err := o.namespaceOf(g.kind, false)
				if err != nil {
					return err
				}
				names := g.names
				if !byName {
					items, err := o.listObjects(ctx, g.kind, ns, selector)
					if err != nil {
						return err
					}
					found = append(found, kindItems{kind: g.kind, namespace: ns, items: items})
					names = nil
					for _, item := range items {
						names = append(names, item.GetName())
					}
				}
				for _, name := range names {
					targets = append(targets, objectName{kind: g.kind, namespace: ns, name: name})
				}
			}
			if len(targets) == 0 {
				o.printNothingFound(found, false)
				return nil
			}
			return o.deleteObjects(ctx, targets, waitForGone, timeout)
		},
	}
	cmd.Flags().BoolVar(&waitForGone, "wait", true, "Wait until the objects are gone before returning")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "How long --wait waits for all of them (0 waits forever)")
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "Delete the objects of the kinds whose labels match this selector (e.g. team=ml)")
	cmd.Flags().BoolVar(&all, "all", false, "Delete every object of the kinds in the namespace")
	return cmd
}

// objectName is one object named on the command line.
type objectName struct {
	kind            *Kind
	namespace, name string
}

// deleteObjects deletes every target, then (with waitForGone) waits for
// each to disappear, printing "kind/name deleted" for each one done. It
// goes on past a target that fails and reports every failure at the end.
func (o *Options) deleteObjects(ctx context.Context, targets []objectName, waitForGone bool, timeout time.Duration) error {
	c, err := o.Client()
	if err != nil {
		return err
	}
	var errs []error
	var deleted []objectName
	for _, t := range targets {
		k, ns, name := t.kind, t.namespace, t.name
		var opts []client.DeleteOption
		if k.RequiredLabel != "" {
			// Never delete something that is not Kairon's (a real kubelet's
			// Node); the precondition pins the object that was checked.
			obj, err := o.getObject(ctx, k, ns, name)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			uid := obj.GetUID()
			opts = append(opts, client.Preconditions{UID: &uid})
		}
		if err := c.Delete(ctx, k.object(ns, name), opts...); err != nil {
			errs = append(errs, o.objectError(k, ns, name, err))
			continue
		}
		if !waitForGone {
			fmt.Fprintf(o.Out, "%s deleted\n", k.ref(name))
			continue
		}
		deleted = append(deleted, t)
	}

	if len(deleted) > 0 {
		waitCtx := ctx
		if timeout > 0 {
			var cancel context.CancelFunc
			waitCtx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		for _, t := range deleted {
			if err := o.waitGone(waitCtx, t.kind, t.namespace, t.name, timeout); err != nil {
				errs = append(errs, err)
				continue
			}
			fmt.Fprintf(o.Out, "%s deleted\n", t.kind.ref(t.name))
		}
	}
	return errors.Join(errs...)
}

// waitGone waits until the object is gone. When ctx ends first, the error
// says what still holds the object (its finalizers), if anything.
func (o *Options) waitGone(ctx context.Context, k *Kind, ns, name string, timeout time.Duration) error {
	c, err := o.Client()
	if err != nil {
		return err
	}
	last, err := waitForObject(ctx, c, k.object(ns, name), 0, func(obj *unstructured.Unstructured) (bool, error) {
		return obj == nil, nil
	})
	if err == nil {
		return nil
	}
	var stopped *waitError
	if !errors.As(err, &stopped) {
		return o.objectError(k, ns, name, err)
	}
	msg := fmt.Sprintf("%s%s was not gone after %s", k.ref(name), k.where(ns), timeout)
	if timeout == 0 {
		msg = fmt.Sprintf("stopped waiting for %s%s to be deleted", k.ref(name), k.where(ns))
	}
	// The last read often races the deadline, so the finalizers last seen
	// say more than its error does.
	switch {
	case last != nil && len(last.GetFinalizers()) > 0:
		msg += fmt.Sprintf("; it still has finalizers %s", strings.Join(last.GetFinalizers(), ", "))
	case stopped.lastErr != nil:
		msg += fmt.Sprintf("; last error: %v", stopped.lastErr)
	}
	return errors.New(msg + " (raise --timeout or pass --wait=false)")
}
