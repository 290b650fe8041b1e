package kaironctl

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/util/jsonpath"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func newGetCommand(o *Options) *cobra.Command {
	var (
		output, selector  string
		allNamespaces     bool
		showManagedFields bool
		watch, watchOnly  bool
		noHeaders         bool
	)
	cmd := &cobra.Command{
		Use:   "get (KIND[,KIND...] [NAME...] | KIND/NAME...)",
		Short: "List objects of one or more kinds, or show some by name",
		Long: `List the objects of one kind in the namespace (of several: machines,machinepools),
or show the ones named: KIND NAME... for one kind, KIND/NAME... (as -o name
prints them) for any mix of kinds.

Kinds:
` + kindHelp() + `
nodes are only the Nodes a Kairon node agent serves (label kairon.zyvor.dev/node).`,
		Example: `  kaironctl get machines
  kaironctl get mp -A
  kaironctl get machine web-1 -o yaml
  kaironctl get mc,mp
  kaironctl get machines -w
  kaironctl get machineclaim/job-42 machine/web-1
  kaironctl get budgets`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError(cmd, "get needs a KIND argument; valid kinds: %s", kindList())
			}
			groups, err := parseObjectArgs(args)
			if err != nil {
				return err
			}
			format, template, err := parseOutput(output)
			if err != nil {
				return err
			}
			byName := named(groups)
			if allNamespaces && byName {
				return usageError(cmd, "-A/--all-namespaces lists a whole kind; it cannot be used with a NAME")
			}
			if selector != "" {
				if byName {
					return usageError(cmd, "-l/--selector cannot be used with a NAME")
				}
				if _, err := labels.Parse(selector); err != nil {
					return fmt.Errorf("invalid -l/--selector %q: %v", selector, err)
				}
			}
			ctx := cmd.Context()
			if watch || watchOnly {
				return o.runGetWatch(ctx, cmd, groups, selector, &getWatch{
					o: o, format: format, template: template, allNamespaces: allNamespaces,
					showManagedFields: showManagedFields, watchOnly: watchOnly, noHeaders: noHeaders,
				})
			}

			found := make([]kindItems, len(groups))
			var errs []error
			for i, g := range groups {
				ns, err := o.namespaceOf(g.kind, allNamespaces)
				if err != nil {
					return err
				}
				found[i] = kindItems{kind: g.kind, namespace: ns}
				if !byName {
					if found[i].items, err = o.listObjects(ctx, g.kind, ns, selector); err != nil {
						return err
					}
					continue
				}
				for _, name := range g.names {
					obj, err := o.getObject(ctx, g.kind, ns, name)
					if err != nil {
						errs = append(errs, err)
						continue
					}
					found[i].items = append(found[i].items, *obj)
				}
			}

			if err := o.printObjects(ctx, found, format, printOptions{
				allNamespaces:     allNamespaces,
				single:            len(groups) == 1 && len(groups[0].names) == 1,
				showManagedFields: showManagedFields,
				namedLookup:       byName,
				template:          template,
				noHeaders:         noHeaders,
			}); err != nil {
				return err
			}
			return errors.Join(errs...)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "Output format: "+strings.Join(outputFormats, ", ")+" (default table)")
	cmd.Flags().BoolVarP(&allNamespaces, "all-namespaces", "A", false, "List the kind in every namespace, with a NAMESPACE column")
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "Only objects whose labels match this selector (e.g. app=web,tier!=db)")
	cmd.Flags().BoolVar(&showManagedFields, "show-managed-fields", false, "Keep metadata.managedFields in json and yaml output")
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "After printing what is there, print every change (a row, or an object with -o json|yaml) until interrupted")
	cmd.Flags().BoolVar(&watchOnly, "watch-only", false, "Like --watch, without first printing what is there")
	cmd.Flags().BoolVar(&noHeaders, "no-headers", false, "Print tables without their header line")
	return cmd
}

type printOptions struct {
	allNamespaces     bool
	single            bool
	showManagedFields bool
	namedLookup       bool
	// template is -o jsonpath's.
	template  *jsonpath.JSONPath
	noHeaders bool
}

// runGetWatch checks get's arguments for a watch (one kind, at most one
// name) and runs g on them.
func (o *Options) runGetWatch(ctx context.Context, cmd *cobra.Command, groups []kindNames, selector string, g *getWatch) error {
	if len(groups) > 1 {
		return usageError(cmd, "-w/--watch watches one kind at a time, got %d", len(groups))
	}
	k, names := groups[0].kind, groups[0].names
	if len(names) > 1 {
		return usageError(cmd, "-w/--watch watches a whole kind or one object, got %d names", len(names))
	}
	ns, err := o.namespaceOf(k, g.allNamespaces)
	if err != nil {
		return err
	}
	name := ""
	if len(names) == 1 {
		// As kubectl: watching one object that is not there is an error.
		name = names[0]
		if _, err := o.getObject(ctx, k, ns, name); err != nil {
			return err
		}
	}
	sel, err := watchSelection(k, ns, name, selector)
	if err != nil {
		return err
	}
	g.kind, g.namespace = k, ns
	g.allNamespaces = g.allNamespaces && k.Namespaced
	return g.run(ctx, sel)
}

// kindItems is what get found of one kind, in namespace ("" for every
// namespace, and for cluster-scoped kinds).
type kindItems struct {
	kind      *Kind
	namespace string
	items     []unstructured.Unstructured
}

// printObjects prints what get found. JSON and YAML are one List of every
// object (the object alone for a single name); tables are one per kind,
// a blank line apart, and when there is more than one kind each NAME says
// its kind (KIND/NAME), as kubectl prints several kinds.
func (o *Options) printObjects(ctx context.Context, found []kindItems, format string, po printOptions) error {
	var all []unstructured.Unstructured
	for _, f := range found {
		all = append(all, f.items...)
	}
	if (format == outputJSON || format == outputYAML || format == outputJSONPath) && !po.showManagedFields {
		for i := range all {
			all[i].SetManagedFields(nil)
		}
	}
	switch format {
	case outputJSON, outputYAML, outputJSONPath:
		var v any = listObject(all)
		if po.single {
			if len(all) == 0 {
				return nil
			}
			v = all[0].Object
		}
		switch format {
		case outputJSON:
			return printJSON(o.Out, v)
		case outputJSONPath:
			return printJSONPath(o.Out, po.template, v)
		}
		return printYAML(o.Out, v)
	case outputName:
		for _, f := range found {
			if err := printNames(o.Out, f.kind, f.items); err != nil {
				return err
			}
		}
		return nil
	}

	if len(all) == 0 {
		if !po.namedLookup {
			o.printNothingFound(found, po.allNamespaces)
		}
		return nil
	}
	printed := false
	for _, f := range found {
		if len(f.items) == 0 {
			continue
		}
		withNamespace := po.allNamespaces && f.kind.Namespaced
		t, err := o.buildTable(ctx, f.kind, f.items, withNamespace)
		if err != nil {
			return err
		}
		if len(found) > 1 {
			nameColumn := 0
			if withNamespace {
				nameColumn = 1
			}
			for _, row := range t.Rows {
				row[nameColumn] = f.kind.ref(row[nameColumn])
			}
		}
		if printed {
			fmt.Fprintln(o.Out)
		}
		if err := (&rowStream{w: o.Out, wide: format == outputWide, noHeaders: po.noHeaders}).write(t); err != nil {
			return err
		}
		printed = true
	}
	return nil
}

// printNothingFound says, as kubectl does, that a listing found nothing,
// naming the namespace when every kind listed was listed in one.
func (o *Options) printNothingFound(found []kindItems, allNamespaces bool) {
	ns := ""
	for _, f := range found {
		if f.kind.Namespaced && !allNamespaces {
			ns = f.namespace
		}
	}
	if ns == "" {
		fmt.Fprintln(o.ErrOut, "No resources found")
		return
	}
	fmt.Fprintf(o.ErrOut, "No resources found in %s namespace.\n", ns)
}

// buildTable turns items into k's table, with a NAMESPACE column in front
// when allNamespaces.
func (o *Options) buildTable(ctx context.Context, k *Kind, items []unstructured.Unstructured, allNamespaces bool) (table, error) {
	rc := &RowContext{Now: o.Now()}
	if k.Prepare != nil {
		if err := k.Prepare(ctx, o, rc); err != nil {
			return table{}, err
		}
	}
	t := table{Columns: k.Columns}
	if allNamespaces {
		t.Columns = append([]Column{{Header: "NAMESPACE"}}, k.Columns...)
	}
	for i := range items {
		row, err := k.Row(&items[i], rc)
		if err != nil {
			return table{}, err
		}
		if allNamespaces {
			row = append([]string{items[i].GetNamespace()}, row...)
		}
		t.Rows = append(t.Rows, row)
	}
	return t, nil
}

// getObject reads one object, with a not-found error that names the kind,
// the object and the namespace.
func (o *Options) getObject(ctx context.Context, k *Kind, ns, name string) (*unstructured.Unstructured, error) {
	c, err := o.Client()
	if err != nil {
		return nil, err
	}
	obj := k.object(ns, name)
	if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		return nil, o.objectError(k, ns, name, err)
	}
	if k.RequiredLabel != "" {
		if _, ok := obj.GetLabels()[k.RequiredLabel]; !ok {
			return nil, fmt.Errorf("%s %q is not a Kairon %s (it has no %s label)", k.Singular, name, k.Singular, k.RequiredLabel)
		}
	}
	return obj, nil
}

// listObjects lists k in ns ("" for every namespace), restricted to
// k.RequiredLabel and the user's selector.
func (o *Options) listObjects(ctx context.Context, k *Kind, ns, selector string) ([]unstructured.Unstructured, error) {
	c, err := o.Client()
	if err != nil {
		return nil, err
	}
	var sel []string
	if k.RequiredLabel != "" {
		sel = append(sel, k.RequiredLabel)
	}
	if selector != "" {
		sel = append(sel, selector)
	}
	opts := &client.ListOptions{Raw: &metav1.ListOptions{LabelSelector: strings.Join(sel, ",")}}
	if k.Namespaced {
		opts.Namespace = ns
	}
	list := k.list()
	if err := c.List(ctx, list, opts); err != nil {
		return nil, fmt.Errorf("listing %s%s: %w", k.Resource, k.where(ns), err)
	}
	return list.Items, nil
}

// objectError rewrites the server's errors about one object so that they
// say which kind, name and namespace, in kaironctl's words.
func (o *Options) objectError(k *Kind, ns, name string, err error) error {
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%s %q not found%s", k.Singular, name, k.where(ns))
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%s %q%s: forbidden: %v", k.Singular, name, k.where(ns), err)
	}
	return fmt.Errorf("%s %q%s: %w", k.Singular, name, k.where(ns), err)
}
