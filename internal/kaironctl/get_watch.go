package kaironctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/util/jsonpath"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// getWatch is `get -w`: what get prints, then every change to the selected
// objects as it happens (a row, an object for json and yaml, a line for
// name), until the user interrupts it. Built on waitFor, so a watch the
// server closes is resumed and a version too old to resume from is listed
// afresh; a change seen again after such a list is not printed twice.
type getWatch struct {
	o      *Options
	kind   *Kind
	format string
	// template is -o jsonpath's.
	template  *jsonpath.JSONPath
	noHeaders bool
	// namespace is where the watch looks ("" for every namespace).
	namespace string
	// allNamespaces adds the NAMESPACE column.
	allNamespaces     bool
	showManagedFields bool
	// watchOnly skips what exists when the watch starts.
	watchOnly bool

	rows    *rowStream
	printed map[string]*unstructured.Unstructured // by namespace/name, as last printed
	started bool
}

// watchSelection is what get -w watches: kind k in ns ("" for every
// namespace), the one object name if given, the objects selector matches.
func watchSelection(k *Kind, ns, name, selector string) (selection, error) {
	sel := selection{
		newList:   func() client.ObjectList { return k.list() },
		namespace: ns,
	}
	if name != "" {
		sel.fields = fields.OneTermEqualSelector("metadata.name", name)
	}
	var terms []string
	if k.RequiredLabel != "" {
		terms = append(terms, k.RequiredLabel)
	}
	if selector != "" {
		terms = append(terms, selector)
	}
	if len(terms) > 0 {
		parsed, err := labels.Parse(strings.Join(terms, ","))
		if err != nil {
			return selection{}, fmt.Errorf("invalid -l/--selector %q: %v", selector, err)
		}
		sel.labels = parsed
	}
	return sel, nil
}

// run watches until ctx ends, which is how a watch is meant to end: that
// is not an error.
func (g *getWatch) run(ctx context.Context, sel selection) error {
	c, err := g.o.Client()
	if err != nil {
		return err
	}
	g.printed = map[string]*unstructured.Unstructured{}
	g.rows = &rowStream{w: g.o.Out, wide: g.format == outputWide, noHeaders: g.noHeaders}
	_, err = waitFor(ctx, c, sel, 0, func(objs []client.Object) (bool, error) {
		return false, g.changed(ctx, objs)
	})
	var stopped *waitError
	if errors.As(err, &stopped) && errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// changed prints what differs from what was printed last: objects new or
// at a new version, and objects gone (as last seen). objs is every
// selected object as it is now.
func (g *getWatch) changed(ctx context.Context, objs []client.Object) error {
	var out []*unstructured.Unstructured
	now := make(map[string]bool, len(objs))
	for _, obj := range objs {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return fmt.Errorf("watching %s: the server sent a %T", g.kind.Resource, obj)
		}
		key := objectKey(u)
		now[key] = true
		if last, ok := g.printed[key]; ok && last.GetResourceVersion() == u.GetResourceVersion() {
			continue
		}
		g.printed[key] = u
		out = append(out, u)
	}
	// Gone since: usually one, from a deletion; several only after the
	// watch had to list afresh.
	var gone []string
	for key := range g.printed {
		if !now[key] {
			gone = append(gone, key)
		}
	}
	slices.Sort(gone)
	for _, key := range gone {
		out = append(out, g.printed[key])
		delete(g.printed, key)
	}
	first := !g.started
	g.started = true
	if first && g.watchOnly {
		return nil
	}
	if first && len(out) == 0 && (g.format == outputTable || g.format == outputWide || g.format == outputName) {
		g.o.printNothingFound([]kindItems{{kind: g.kind, namespace: g.namespace}}, g.allNamespaces)
	}
	return g.print(ctx, out)
}

// print writes objs in the watch's format.
func (g *getWatch) print(ctx context.Context, objs []*unstructured.Unstructured) error {
	if len(objs) == 0 {
		return nil
	}
	items := make([]unstructured.Unstructured, len(objs))
	for i, u := range objs {
		items[i] = *u.DeepCopy()
		if !g.showManagedFields {
			items[i].SetManagedFields(nil)
		}
	}
	switch g.format {
	case outputJSON:
		for i := range items {
			if err := printJSON(g.o.Out, items[i].Object); err != nil {
				return err
			}
		}
		return nil
	case outputYAML:
		for i := range items {
			if _, err := io.WriteString(g.o.Out, "---\n"); err != nil {
				return err
			}
			if err := printYAML(g.o.Out, items[i].Object); err != nil {
				return err
			}
		}
		return nil
	case outputJSONPath:
		for i := range items {
			if err := printJSONPath(g.o.Out, g.template, items[i].Object); err != nil {
				return err
			}
		}
		return nil
	case outputName:
		return printNames(g.o.Out, g.kind, items)
	}
	t, err := g.o.buildTable(ctx, g.kind, items, g.allNamespaces)
	if err != nil {
		return err
	}
	return g.rows.write(t)
}
